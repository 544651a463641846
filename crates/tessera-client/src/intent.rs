//! The client's side of leased, fenced parity locks and of intent records (the store's
//! `intent` module explains the protocol and argues why no acknowledged byte is lost).
//!
//! A lock is taken with [`FileContext::lock_parity`]; a record a dead holder left is handed
//! over with the grant and resolved with [`FileContext::resolve_orphan`] before anything
//! else. A read-modify-write records its intent ([`FileContext::record_intent`]) before it
//! writes any data, and keeps its lease alive while its data requests are out
//! ([`FileContext::renewing`]). Reconstruction from parity corrects for a record still
//! unresolved ([`FileContext::parity_as_before`]).
//!
//! Full-stripe writes take stale-parity records instead ([`FileContext::record_stale`],
//! renewed by [`FileContext::renewing_stale`], cleared by [`FileContext::clear_stale`]); a
//! lock holder handed an orphaned one resolves it with [`FileContext::resolve_stale`], and a
//! reconstruction under one is refused ([`FileContext::torn`]): `tessera-store`'s `stale`
//! module argues why.

use crate::context::{Fault, FileContext};
use crate::{Client, ClientError};
use bytes::Bytes;
use std::future::Future;
use std::time::Duration;
use tessera_layout::Region;
use tessera_wire::{
    IndexRange, IntentPiece, LockToken, ParityIntent, StaleToken, StorageError, StorageRequest,
    StorageResponse,
};

/// How often a holder renews its lease while its data requests are out: a third of the
/// servers' lease (`tessera_server::PARITY_LEASE`, 600 ms), so two renewals may be lost.
const RENEW_INTERVAL: Duration = Duration::from_millis(200);

/// How many times a lock request answered `LockBusy` is repeated before giving up (each
/// waits up to the server's bound, 2 s).
const LOCK_BUSY_ATTEMPTS_MAX: usize = 8;

/// A parity lock held: where, and its fencing token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParityLock {
    pub column: u32,
    pub stripe: u64,
    pub token: LockToken,
}

/// What a lock grant brings: the lock, the parity bytes asked for, and a record left by a
/// dead holder (with its old parity and old data).
pub(crate) struct Grant {
    pub lock: ParityLock,
    pub parity: Bytes,
    pub orphan: Option<(ParityIntent, Bytes)>,
    /// The stripe is under an orphaned stale-parity record: an interrupted full-stripe write.
    pub stale: bool,
}

/// A stale-parity record a full-stripe write holds at one parity column.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StaleRecord {
    pub column: u32,
    pub token: StaleToken,
}

impl FileContext {
    /// Locks `stripe`'s parity and reads `len` bytes at `offset` of the parity column's
    /// redundancy file. A busy lock (other holders) is asked for again, never taken for a
    /// failed server.
    pub(crate) async fn lock_parity(
        &self,
        client: &Client,
        stripe: u64,
        offset: u64,
        len: u32,
    ) -> Result<Grant, Fault> {
        let column = self.layout.parity_slot(stripe).expect("parity").column;
        let request = StorageRequest::LockParity {
            file: self.meta.id,
            stripe,
            offset,
            len,
        };
        let mut attempts = 0;
        let (response, payload) = loop {
            attempts += 1;
            match self
                .rpc(client, column, request.clone(), Bytes::new())
                .await
            {
                Err(Fault::Refused(StorageError::LockBusy { .. }))
                    if attempts < LOCK_BUSY_ATTEMPTS_MAX => {}
                other => break other?,
            }
        };
        let StorageResponse::Locked {
            token,
            intent,
            stale,
        } = response
        else {
            return Err(Fault::Refused(StorageError::BadRequest {
                detail: format!("expected a lock grant, got {response:?}"),
            }));
        };
        let lock = ParityLock {
            column,
            stripe,
            token,
        };
        let orphan_bytes = intent
            .as_ref()
            .map_or(0, |i| i.span_len as usize + i.old_data_bytes() as usize);
        if payload.len() != len as usize + orphan_bytes {
            self.unlock(client, lock).await;
            return Err(Fault::Refused(StorageError::BadRequest {
                detail: "short parity read".into(),
            }));
        }
        Ok(Grant {
            lock,
            parity: payload.slice(..len as usize),
            orphan: intent.map(|i| (i, payload.slice(len as usize..))),
            stale,
        })
    }

    /// Makes the span of a dead holder's record consistent with what the data columns hold
    /// now (`P ^ D ^ X`, byte by byte), and releases the lock. A piece whose column cannot be
    /// read is rolled back instead: its column is recorded as owing the stripe, and the
    /// span's parity there stays `P`, which matches its old data `D`.
    pub(crate) async fn resolve_orphan(
        &self,
        client: &Client,
        lock: ParityLock,
        intent: &ParityIntent,
        bytes: &[u8],
    ) -> Result<(), ClientError> {
        let span = intent.span_len as usize;
        let (old_parity, mut old_data) = bytes.split_at(span);
        let mut parity = old_parity.to_vec();
        for piece in &intent.pieces {
            let (old, rest) = old_data.split_at(piece.len as usize);
            old_data = rest;
            let at = (piece.offset_in_unit - intent.span_start) as usize;
            match self.piece_now(client, lock.stripe, piece).await {
                Some(now) => {
                    let span = &mut parity[at..at + piece.len as usize];
                    tessera_parity::update_parity(span, old, &now);
                }
                None => {
                    let stripe = IndexRange::new(lock.stripe, lock.stripe + 1);
                    self.report_missed(client, piece.column, stripe).await?;
                }
            }
        }
        tracing::info!(
            "file {} stripe {}: resolved the intent record of a dead writer",
            self.meta.path,
            lock.stripe
        );
        let offset = intent.unit_offset + u64::from(intent.span_start);
        // A failure here leaves the record for the next holder.
        let _ = self
            .write_parity(client, lock, offset, Bytes::from(parity), true)
            .await;
        Ok(())
    }

    /// What a piece's column holds now, if it can be read.
    async fn piece_now(
        &self,
        client: &Client,
        stripe: u64,
        piece: &IntentPiece,
    ) -> Option<Vec<u8>> {
        if self.lost(piece.column, stripe) {
            return None;
        }
        let block = self.block_on_column(stripe, piece.column)?;
        let offset = self.layout.local_offset(self.layout.data_slot(block))
            + u64::from(piece.offset_in_unit);
        self.read_region(
            client,
            piece.column,
            Region::Data,
            offset,
            piece.len as usize,
            false,
        )
        .await
        .ok()
    }

    /// The data block of `stripe` on `column`, if the column holds one.
    pub(crate) fn block_on_column(&self, stripe: u64, column: u32) -> Option<u64> {
        self.layout
            .blocks_of_stripe(stripe)
            .find(|&block| self.layout.data_slot(block).column == column)
    }

    /// Records at the parity server what is about to be written (`old_data`: each piece's old
    /// bytes, in order), durably, before any data is written.
    pub(crate) async fn record_intent(
        &self,
        client: &Client,
        lock: ParityLock,
        intent: ParityIntent,
        old_data: Vec<u8>,
    ) -> Result<(), Fault> {
        let request = StorageRequest::RecordIntent {
            file: self.meta.id,
            stripe: lock.stripe,
            token: lock.token,
            intent,
        };
        self.rpc(client, lock.column, request, Bytes::from(old_data))
            .await
            .map(|_| ())
    }

    /// Writes parity at `offset` under the lock (fenced by its token), releasing the lock if
    /// `unlock`.
    pub(crate) async fn write_parity(
        &self,
        client: &Client,
        lock: ParityLock,
        offset: u64,
        parity: Bytes,
        unlock: bool,
    ) -> Result<(), Fault> {
        let request = StorageRequest::WriteParity {
            file: self.meta.id,
            stripe: lock.stripe,
            offset,
            unlock,
            token: lock.token,
        };
        self.rpc(client, lock.column, request, parity)
            .await
            .map(|_| ())
    }

    /// Releases a lock without writing (best effort: a lock not released is broken when its
    /// lease runs out).
    pub(crate) async fn unlock(&self, client: &Client, lock: ParityLock) {
        let request = StorageRequest::UnlockParity {
            file: self.meta.id,
            stripe: lock.stripe,
            token: lock.token,
        };
        let _ = self.rpc(client, lock.column, request, Bytes::new()).await;
    }

    /// Runs `work` while renewing the lease of `lock` every [`RENEW_INTERVAL`].
    pub(crate) async fn renewing<T>(
        &self,
        client: &Client,
        lock: ParityLock,
        work: impl Future<Output = T>,
    ) -> T {
        let renew = async {
            loop {
                tokio::time::sleep(RENEW_INTERVAL).await;
                let request = StorageRequest::RenewParity {
                    file: self.meta.id,
                    stripe: lock.stripe,
                    token: lock.token,
                };
                // A lost renewal is not fatal: the parity write that follows is fenced.
                let _ = self.rpc(client, lock.column, request, Bytes::new()).await;
            }
        };
        tokio::pin!(work);
        tokio::pin!(renew);
        match futures::future::select(work, renew).await {
            futures::future::Either::Left((done, _)) => done,
            futures::future::Either::Right((never, _)) => never,
        }
    }

    /// The stripe's unresolved record, if any, from its parity column, and whether the
    /// stripe is under an orphaned stale-parity record. The server waits out a live one (a
    /// full-stripe write in flight, bounded) before it answers.
    pub(crate) async fn read_intent(
        &self,
        client: &Client,
        stripe: u64,
    ) -> Result<StripeIntent, Fault> {
        let column = self.layout.parity_slot(stripe).expect("parity").column;
        let request = StorageRequest::ReadIntent {
            file: self.meta.id,
            stripe,
        };
        let (response, payload) = self.rpc(client, column, request, Bytes::new()).await?;
        match response {
            StorageResponse::Intent {
                intent: None,
                stale,
                waited,
                generation,
            } => Ok(StripeIntent {
                intent: None,
                stale,
                waited,
                generation,
            }),
            StorageResponse::Intent {
                intent: Some(intent),
                stale,
                waited,
                generation,
            } if payload.len() as u64 == u64::from(intent.span_len) + intent.old_data_bytes() => {
                Ok(StripeIntent {
                    intent: Some((intent, payload)),
                    stale,
                    waited,
                    generation,
                })
            }
            other => Err(Fault::Refused(StorageError::BadRequest {
                detail: format!("expected an intent record, got {other:?}"),
            })),
        }
    }
}

/// What a stripe's parity column says of its records ([`FileContext::read_intent`]).
pub(crate) struct StripeIntent {
    /// The unresolved intent record and its old bytes, if any.
    pub intent: Option<(ParityIntent, Bytes)>,
    /// Under an orphaned stale-parity record: parity cannot reconstruct a data column.
    pub stale: bool,
    /// A full-stripe write was in flight when asked and the answer waited for it: what was
    /// read of the stripe before may be half of it.
    pub waited: bool,
    /// The stripe's generation at the parity server: a different one after a read of the
    /// stripe than before it means a write completed in between.
    pub generation: u64,
}

impl FileContext {
    /// The error for bytes of `stripe` on `column` under an unresolved stale-parity record.
    pub(crate) fn torn(&self, column: u32, stripe: u64) -> ClientError {
        ClientError::TornStripe {
            path: self.meta.path.clone(),
            stripe,
            server: self.columns[column as usize].server,
            addr: self.columns[column as usize].addr,
        }
    }

    /// Resolves an orphaned stale-parity record over `lock`'s stripe (an interrupted
    /// full-stripe write): parity computed from every data unit as it is now, then the stripe
    /// taken out of the orphaned records, then the lock released. A data unit that cannot be
    /// read leaves the stripe unresolved: [`ClientError::TornStripe`] (see
    /// `tessera-store`'s `stale` module). Any intent record of the stripe goes with the
    /// parity write.
    pub(crate) async fn resolve_stale(
        &self,
        client: &Client,
        lock: ParityLock,
    ) -> Result<(), ClientError> {
        let stripe = lock.stripe;
        let unit = self.unit();
        let reads = self
            .layout
            .blocks_of_stripe(stripe)
            .map(|block| async move {
                let slot = self.layout.data_slot(block);
                if self.lost(slot.column, stripe) {
                    return Err(slot.column);
                }
                let offset = self.layout.local_offset(slot);
                self.read_region(client, slot.column, Region::Data, offset, unit, false)
                    .await
                    .map_err(|_| slot.column)
            });
        let units = self
            .renewing(client, lock, futures::future::try_join_all(reads))
            .await;
        let units = match units {
            Ok(units) => units,
            Err(column) => {
                self.unlock(client, lock).await;
                return Err(self.torn(column, stripe));
            }
        };
        let mut parity = vec![0u8; unit];
        for data in &units {
            tessera_parity::xor_into(&mut parity, data);
        }
        let offset = self
            .layout
            .local_offset(self.layout.parity_slot(stripe).expect("parity"));
        // A failure leaves the record for the next holder.
        if self
            .write_parity(client, lock, offset, Bytes::from(parity), false)
            .await
            .is_ok()
        {
            let stripes = IndexRange::new(stripe, stripe + 1);
            let _ = self.clear_stale(client, lock.column, None, stripes).await;
            tracing::info!(
                "file {} stripe {stripe}: resolved the stale parity of an interrupted \
                 full-stripe write",
                self.meta.path
            );
        }
        self.unlock(client, lock).await;
        Ok(())
    }

    /// Records durably at parity column `column` that parity of `stripes` may not match the
    /// data from now on (a full-stripe write is about to start).
    pub(crate) async fn record_stale(
        &self,
        client: &Client,
        column: u32,
        stripes: IndexRange,
    ) -> Result<StaleRecord, Fault> {
        let request = StorageRequest::RecordStale {
            file: self.meta.id,
            stripes,
        };
        match self.rpc(client, column, request, Bytes::new()).await? {
            (StorageResponse::StaleRecorded { token }, _) => Ok(StaleRecord { column, token }),
            (other, _) => Err(Fault::Refused(StorageError::BadRequest {
                detail: format!("expected a stale-parity record, got {other:?}"),
            })),
        }
    }

    /// Deletes record `token` at `column` (if given) and takes `stripes` out of the orphaned
    /// records there.
    pub(crate) async fn clear_stale(
        &self,
        client: &Client,
        column: u32,
        token: Option<StaleToken>,
        stripes: IndexRange,
    ) -> Result<(), Fault> {
        let request = StorageRequest::ClearStale {
            file: self.meta.id,
            token,
            stripes,
        };
        self.rpc(client, column, request, Bytes::new())
            .await
            .map(|_| ())
    }

    /// Runs `work` while renewing `records` every [`RENEW_INTERVAL`].
    pub(crate) async fn renewing_stale<T>(
        &self,
        client: &Client,
        records: &[StaleRecord],
        work: impl Future<Output = T>,
    ) -> T {
        if records.is_empty() {
            return work.await;
        }
        let renew = async {
            loop {
                tokio::time::sleep(RENEW_INTERVAL).await;
                let renewals = records.iter().map(|record| {
                    let request = StorageRequest::RenewStale {
                        file: self.meta.id,
                        token: record.token,
                    };
                    self.rpc(client, record.column, request, Bytes::new())
                });
                // A lost renewal must not hold back the next round (its request would wait
                // for the transport's timeout, past the record's lease): a writer slowed by
                // a lost data request would then have its record resolved under it, parity
                // recomputed from a column its write has not reached yet.
                let _ =
                    tokio::time::timeout(RENEW_INTERVAL, futures::future::join_all(renewals)).await;
            }
        };
        tokio::pin!(work);
        tokio::pin!(renew);
        match futures::future::select(work, renew).await {
            futures::future::Either::Left((done, _)) => done,
            futures::future::Either::Right((never, _)) => never,
        }
    }
}

/// Corrects `out`, the XOR of parity and every data unit of a stripe but `own`'s over bytes
/// `within..within+len` of the unit (`units` holds what was read, by column, the parity
/// column's included), for an unresolved record: inside its span, the parity and the written
/// pieces are replaced by their values from before the write, which is what the untouched
/// columns still match.
pub(crate) fn parity_as_before(
    out: &mut [u8],
    within: u64,
    own: u32,
    parity_column: u32,
    units: &[(u32, Vec<u8>)],
    intent: &ParityIntent,
    bytes: &[u8],
) {
    let (old_parity, mut old_data) = bytes.split_at(intent.span_len as usize);
    let mut replace = |column: u32, start: u64, old: &[u8]| {
        // Bytes start..start+old.len() of the unit, as they were, replace what was read.
        let lo = start.max(within);
        let hi = (start + old.len() as u64).min(within + out.len() as u64);
        let Some((_, now)) = units.iter().find(|(c, _)| *c == column) else {
            return;
        };
        for at in lo..hi {
            let i = (at - within) as usize;
            out[i] ^= now[i] ^ old[(at - start) as usize];
        }
    };
    replace(parity_column, u64::from(intent.span_start), old_parity);
    for piece in &intent.pieces {
        let (old, rest) = old_data.split_at(piece.len as usize);
        old_data = rest;
        if piece.column != own {
            replace(piece.column, u64::from(piece.offset_in_unit), old);
        }
    }
}
