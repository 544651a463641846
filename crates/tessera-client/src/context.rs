//! A file's view for one operation: layout, the server of each column, and which columns count
//! as lost for which stripes.

use crate::{Client, ClientError};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tessera_layout::{Layout, OverflowRole, Region, Scheme};
use tessera_transport::TransportError;
use tessera_wire::{
    FileMeta, Incarnation, IndexRange, ManagerRequest, ManagerResponse, OverflowExtent, ServerId,
    ServerState, StorageCall, StorageError, StorageRequest, StorageResponse,
};

/// One column's server.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub server: ServerId,
    pub addr: SocketAddr,
    /// Its store: requests name it, and another store at the address refuses them.
    pub incarnation: Incarnation,
    /// Down at the manager when the view was taken.
    pub down: bool,
    /// Stripes of this file the server owes.
    pub missed: Vec<IndexRange>,
}

/// Why a request to a column failed.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The server did not answer: it counts as lost from now on.
    Unreachable(TransportError),
    /// The server answered with an error.
    Refused(StorageError),
}

/// Everything one operation needs about a file.
pub(crate) struct FileContext {
    pub meta: FileMeta,
    pub layout: Layout,
    pub columns: Vec<Column>,
    /// Columns found unreachable during this operation.
    lost_now: Mutex<Vec<bool>>,
    /// Stripes already reported missed per column during this operation.
    reported: Mutex<BTreeMap<u32, Vec<u64>>>,
    /// (column, stripe) pairs found owed since the view was taken ([`Self::revalidate`]).
    owed_now: Mutex<BTreeSet<(u32, u64)>>,
    /// Reads see the file as snapshot of this epoch saw it (see `snapshot.rs`), and never
    /// repair: the live file is not theirs to write.
    pub snapshot: Option<u64>,
    /// The first stripe no write through this context has touched, in a file this context
    /// made pending (`None` for any other): see `FileContext::take_fresh`.
    pub(crate) fresh_from: Mutex<Option<u64>>,
    /// Stripes written fresh by a write still in flight, each with the lock that write holds
    /// until it is done: a later write touching one, through any context of the file in
    /// this client, waits for it (see `FileContext::take_fresh`).
    pub(crate) fresh_in_flight: FreshInFlight,
    /// Servers whose debts of the file this context sets aside: the servers a restore of
    /// kept bytes just put the file back on, resynced before their debts are cleared
    /// (`restore.rs`). [`Self::revalidate`] does not count their debts either.
    pub(crate) debts_set_aside: Vec<ServerId>,
}

/// The lock a fresh stripe's write holds while in flight (see `FileContext::take_fresh`).
pub(crate) type FreshStripe = Arc<tokio::sync::RwLock<()>>;

/// A file's stripes written fresh and still in flight, shared by its contexts in a client.
pub(crate) type FreshInFlight = Arc<Mutex<BTreeMap<u64, FreshStripe>>>;

/// A pending file made in this client for fresh writes ([`Client::fresh`]).
pub(crate) struct FreshFile {
    /// Its maker's context is still its only one: only then are stripes written fresh.
    pub(crate) sole: bool,
    /// Every context of the file shares these, so a write through a second one waits for
    /// a fresh write the first still has in flight.
    pub(crate) in_flight: FreshInFlight,
}

impl Client {
    pub(crate) async fn context_of(
        &self,
        file: tessera_wire::FileId,
    ) -> Result<FileContext, ClientError> {
        let view = self.lookup_view(file).await?;
        self.context_from(view)
    }

    /// The manager's view of a file now: its columns' servers, their state and debts.
    pub(crate) async fn lookup_view(
        &self,
        file: tessera_wire::FileId,
    ) -> Result<tessera_wire::FileView, ClientError> {
        match self.manager_call(ManagerRequest::LookupId { file }).await? {
            ManagerResponse::File(view) => Ok(view),
            other => Err(ClientError::Protocol {
                peer: format!("manager {}", self.manager()),
                detail: format!("expected a file view, got {other:?}"),
            }),
        }
    }

    /// The context of a file the manager just described.
    pub(crate) fn context_from(
        &self,
        view: tessera_wire::FileView,
    ) -> Result<FileContext, ClientError> {
        let columns = view
            .columns
            .iter()
            .map(|status| {
                let addr = status.addr.parse().map_err(|_| ClientError::Protocol {
                    peer: format!("manager {}", self.manager()),
                    detail: format!("bad server address '{}'", status.addr),
                })?;
                let missed = view
                    .missed
                    .iter()
                    .filter(|m| m.server == status.id)
                    .flat_map(|m| m.stripes.iter().copied())
                    .collect();
                Ok(Column {
                    server: status.id,
                    addr,
                    incarnation: status.incarnation,
                    down: status.state == ServerState::Down,
                    missed,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        // Another context of a file pending here: its maker is no longer its only writer,
        // and this one waits for the fresh writes still in flight as the maker's do.
        let fresh_in_flight = match self.fresh_files().get_mut(&view.meta.id) {
            Some(file) => {
                file.sole = false;
                file.in_flight.clone()
            }
            None => FreshInFlight::default(),
        };
        let width = columns.len();
        Ok(FileContext {
            layout: view.meta.layout,
            meta: view.meta,
            columns,
            lost_now: Mutex::new(vec![false; width]),
            reported: Mutex::new(BTreeMap::new()),
            owed_now: Mutex::new(BTreeSet::new()),
            fresh_from: Mutex::new(None),
            fresh_in_flight,
            snapshot: None,
            debts_set_aside: Vec::new(),
        })
    }
}

impl FileContext {
    /// A file's context with no server behind it: `down` marks the columns lost.
    #[cfg(test)]
    pub(crate) fn detached(layout: Layout, down: &[bool]) -> FileContext {
        let columns = down
            .iter()
            .enumerate()
            .map(|(i, &down)| Column {
                server: i as ServerId + 1,
                addr: SocketAddr::from(([127, 0, 0, 1], 9)),
                incarnation: 1,
                down,
                missed: Vec::new(),
            })
            .collect();
        FileContext {
            meta: tessera_wire::FileMeta {
                id: 7,
                path: "f".into(),
                layout,
                servers: (1..=down.len() as ServerId).collect(),
                size: 0,
            },
            layout,
            columns,
            lost_now: Mutex::new(vec![false; down.len()]),
            reported: Mutex::new(BTreeMap::new()),
            owed_now: Mutex::new(BTreeSet::new()),
            fresh_from: Mutex::new(None),
            fresh_in_flight: FreshInFlight::default(),
            snapshot: None,
            debts_set_aside: Vec::new(),
        }
    }

    pub fn scheme(&self) -> Scheme {
        self.layout.scheme
    }

    pub fn unit(&self) -> usize {
        self.layout.stripe_unit as usize
    }

    /// Refuse `offset..offset+len` if it ends past the file's maximum size (or past `u64`).
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        let max = self.layout.file_bytes_max();
        match offset.checked_add(len) {
            Some(end) if end <= max => Ok(()),
            _ => Err(ClientError::TooLarge {
                path: self.meta.path.clone(),
                offset,
                len,
                max,
            }),
        }
    }

    /// Whether `column` must not be used for `stripe`: down, owing it, or found unreachable.
    pub fn lost(&self, column: u32, stripe: u64) -> bool {
        let c = &self.columns[column as usize];
        c.down
            || self.lost_now.lock().unwrap()[column as usize]
            || c.missed.iter().any(|r| r.contains(stripe))
            || self.owed_now.lock().unwrap().contains(&(column, stripe))
    }

    /// Asks the manager again which columns are down or owe `stripe`, after the stripe's
    /// parity lock was granted and before anything is computed from the columns' bytes;
    /// whether a column this operation counted on for the stripe is not to be used (it is
    /// counted lost from now on).
    ///
    /// The view was taken when the operation began, and the lock may have been granted much
    /// later: meanwhile a column can go down, miss a write of the stripe (its writer records
    /// that at the manager before writing anything), and come back serving its old bytes.
    /// Parity computed from those bytes destroys the write's: explorer seed 3776 of
    /// `write_hole_no_acknowledged_byte_lost_parity_schemes` had the torn-stripe resolver,
    /// its lock granted after such a write, recompute a Hybrid stripe's parity from a stale
    /// unit and rebuild the owing column from it, losing acknowledged bytes. A writer whose
    /// record came before the grant is seen here: a read-modify-writer held the lock until
    /// after its record; a full-stripe writer's record precedes its stale-parity record, which
    /// the grant waits out or hands over. With replicated managers the view comes from one
    /// replica, which may lag a record acknowledged by another (README, known gaps).
    pub async fn revalidate(&self, client: &Client, stripe: u64) -> Result<bool, ClientError> {
        if client.pending_files().contains(&self.meta.id) {
            // Nobody else writes a file pending at this client (a put not yet committed):
            // no other writer can have left a column owing it, so no manager round trip.
            return Ok(false);
        }
        let view = client.lookup_view(self.meta.id).await?;
        let mut changed = false;
        for (index, status) in view.columns.iter().enumerate() {
            let Some(column) = self.columns.get(index) else {
                break;
            };
            let at = index as u32;
            let owes = view
                .missed
                .iter()
                .any(|m| m.server == status.id && m.stripes.iter().any(|r| r.contains(stripe)))
                && !self.debts_set_aside.contains(&status.id);
            let replaced = status.id != column.server || status.incarnation != column.incarnation;
            if (owes || replaced || status.state == ServerState::Down) && !self.lost(at, stripe) {
                tracing::debug!(
                    "{} column {at}: found owing stripe {stripe} after its lock was granted",
                    self.meta.path
                );
                self.owed_now.lock().unwrap().insert((at, stripe));
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Whether `column` is unusable for the whole operation.
    pub fn lost_entirely(&self, column: u32) -> bool {
        self.columns[column as usize].down || self.lost_now.lock().unwrap()[column as usize]
    }

    pub fn unavailable(&self, columns: impl IntoIterator<Item = u32>) -> ClientError {
        let mut servers: Vec<(ServerId, SocketAddr)> = columns
            .into_iter()
            .map(|c| {
                (
                    self.columns[c as usize].server,
                    self.columns[c as usize].addr,
                )
            })
            .collect();
        servers.sort();
        servers.dedup();
        ClientError::Unavailable {
            path: self.meta.path.clone(),
            scheme: self.scheme(),
            servers,
        }
    }

    pub fn storage_error(&self, column: u32, error: StorageError) -> ClientError {
        ClientError::Storage {
            server: self.columns[column as usize].server,
            addr: self.columns[column as usize].addr,
            error,
        }
    }

    pub(crate) fn fault_error(&self, column: u32, fault: Fault) -> ClientError {
        match fault {
            Fault::Unreachable(e) => {
                tracing::debug!("column {column}: {e}");
                self.unavailable([column])
            }
            Fault::Refused(e) => self.storage_error(column, e),
        }
    }

    /// Send one request to a column's server.
    pub async fn rpc(
        &self,
        client: &Client,
        column: u32,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), Fault> {
        let Column {
            addr, incarnation, ..
        } = self.columns[column as usize];
        let lock = match &request {
            StorageRequest::LockParity { stripe, .. } => Some(*stripe),
            _ => None,
        };
        // Every request to a server, for replaying a simulated run request by request.
        tracing::trace!(
            "{} column {column}: {request:?}, {} bytes",
            self.meta.path,
            payload.len()
        );
        let retry = retry_safe(&request).then(|| (request.clone(), payload.clone()));
        let mut answer = call_store(client, addr, incarnation, request, payload).await;
        // Known alive after a timeout (it answers a fresh ping): the request or its answer
        // was lost on the way. A request that only reads, or writes the same bytes again, is
        // sent once more rather than leaving its column owing the stripe: two losses in one
        // write would otherwise leave two columns of a stripe owing it, beyond what parity
        // rebuilds though every server is up (explorer seed 1084 of
        // `lost_messages_with_server_faults_every_scheme`). If the first copy only waited at
        // the server (its disk queue), it is served before the second, which arrived later
        // (`tessera_server::schedule` serves in arrival order, or deadline order with the
        // first copy's deadline earlier), so a later write of the same bytes never lands
        // under it.
        // Set when the ping just went unanswered: asking again below would tell nothing new.
        let mut silent = false;
        if let (Err(TransportError::Timeout { .. }), Some((request, payload))) = (&answer, retry) {
            silent = !self.answers(client, column).await;
            if !silent {
                tracing::debug!("column {column}: a request timed out, sent again");
                answer = call_store(client, addr, incarnation, request, payload).await;
            }
        }
        tracing::trace!(
            "{} column {column}: answered {:?}",
            self.meta.path,
            answer.as_ref().map(|(response, _)| response)
        );
        match answer {
            Ok((StorageResponse::Error(e), _)) => Err(Fault::Refused(e)),
            Ok(answer) => Ok(answer),
            Err(TransportError::Timeout { .. })
                if lock.is_some() && self.answers(client, column).await =>
            {
                // Waiting for a lock is not a server failure: the server answers, so the
                // lock is only busy (the server bounds waits itself; this is a fallback).
                let stripe = lock.expect("a lock request");
                Err(Fault::Refused(StorageError::LockBusy { stripe }))
            }
            Err(e) => {
                let first = {
                    let mut lost = self.lost_now.lock().unwrap();
                    !std::mem::replace(&mut lost[column as usize], true)
                };
                // A timeout alone does not make a server down: this process may have been
                // stopped (SIGSTOP, a long pause) with its timers running out while the
                // answers waited in its socket. The request still fails (a write records
                // the miss); the server is reported down for every client only if it does
                // not answer a fresh ping either.
                let timed_out = matches!(e, TransportError::Timeout { .. });
                if first && !(timed_out && !silent && self.answers(client, column).await) {
                    let server = self.columns[column as usize].server;
                    tracing::warn!("server {server} ({addr}) unreachable: {e}");
                    let _ = client
                        .manager_call(ManagerRequest::ReportDown { server })
                        .await;
                }
                Err(Fault::Unreachable(e))
            }
        }
    }

    /// Whether `column`'s server answers a ping.
    async fn answers(&self, client: &Client, column: u32) -> bool {
        let Column {
            addr, incarnation, ..
        } = self.columns[column as usize];
        matches!(
            call_store(
                client,
                addr,
                incarnation,
                StorageRequest::Ping,
                Bytes::new()
            )
            .await,
            Ok((StorageResponse::Pong { .. }, _))
        )
    }

    /// Like [`rpc`](Self::rpc), with a fault turned into an error naming the server.
    pub async fn rpc_or_fail(
        &self,
        client: &Client,
        column: u32,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), ClientError> {
        self.rpc(client, column, request, payload)
            .await
            .map_err(|fault| self.fault_error(column, fault))
    }

    /// Read bytes of a data or redundancy file on a column, into a buffer of our own.
    pub async fn read_region(
        &self,
        client: &Client,
        column: u32,
        region: Region,
        offset: u64,
        len: usize,
        overlay: bool,
    ) -> Result<Vec<u8>, Fault> {
        self.read_region_bytes(client, column, region, offset, len, overlay)
            .await
            .map(|bytes| bytes.to_vec())
    }

    /// Read bytes of a data or redundancy file on a column, as received (no copy).
    pub async fn read_region_bytes(
        &self,
        client: &Client,
        column: u32,
        region: Region,
        offset: u64,
        len: usize,
        overlay: bool,
    ) -> Result<Bytes, Fault> {
        let request = match self.snapshot {
            None => StorageRequest::Read {
                file: self.meta.id,
                region,
                offset,
                len: len as u32,
                overlay,
            },
            Some(epoch) => StorageRequest::ReadSnapshot {
                file: self.meta.id,
                region,
                offset,
                len: len as u32,
                epoch,
            },
        };
        let (_, data) = self.rpc(client, column, request, Bytes::new()).await?;
        if data.len() != len {
            return Err(Fault::Refused(StorageError::BadRequest {
                detail: format!("asked for {len} bytes, got {}", data.len()),
            }));
        }
        Ok(data)
    }

    /// Overflow entries of `role` on a column for `offset..offset+len` of the primary's data file.
    pub async fn overflow_list(
        &self,
        client: &Client,
        column: u32,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(OverflowExtent, Bytes)>, Fault> {
        let request = StorageRequest::OverflowList {
            file: self.meta.id,
            role,
            offset,
            len,
        };
        let (response, payload) = self.rpc(client, column, request, Bytes::new()).await?;
        let StorageResponse::Overflow { entries } = response else {
            return Err(Fault::Refused(StorageError::BadRequest {
                detail: "expected overflow entries".into(),
            }));
        };
        let mut at = 0usize;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let end = at + entry.len as usize;
            if end > payload.len() {
                return Err(Fault::Refused(StorageError::BadRequest {
                    detail: "overflow listing shorter than its entries".into(),
                }));
            }
            out.push((entry, payload.slice(at..end)));
            at = end;
        }
        Ok(out)
    }

    /// Record at the manager that `column` missed writes to `stripes` (before the write is
    /// acknowledged, so a server that comes back never serves what it missed).
    pub async fn report_missed(
        &self,
        client: &Client,
        column: u32,
        stripes: IndexRange,
    ) -> Result<(), ClientError> {
        {
            let mut reported = self.reported.lock().unwrap();
            let seen = reported.entry(column).or_default();
            if stripes.end - stripes.start == 1 && seen.contains(&stripes.start) {
                return Ok(());
            }
            if stripes.end - stripes.start == 1 {
                seen.push(stripes.start);
            }
        }
        tracing::debug!("column {column} misses {stripes:?}");
        client
            .manager_call(ManagerRequest::ReportMissed {
                server: self.columns[column as usize].server,
                file: self.meta.id,
                stripes,
            })
            .await
            .map(|_| ())
    }

    /// The address and store of each of `servers`, if every one holds a column here and was
    /// not down when the view was taken.
    pub fn stores_of(&self, servers: &[ServerId]) -> Option<Vec<(SocketAddr, Incarnation)>> {
        servers
            .iter()
            .map(|id| {
                let column = self.columns.iter().find(|c| c.server == *id && !c.down)?;
                Some((column.addr, column.incarnation))
            })
            .collect()
    }

    /// Bytes stored on each reachable server, and the servers that could not be asked.
    pub async fn usage(&self, client: &Client) -> (u64, Vec<ServerId>) {
        let asks = (0..self.layout.width).map(|column| async move {
            if self.lost_entirely(column) {
                return Err(self.columns[column as usize].server);
            }
            let request = StorageRequest::Usage { file: self.meta.id };
            match self.rpc(client, column, request, Bytes::new()).await {
                Ok((StorageResponse::Usage { stored_bytes }, _)) => Ok(stored_bytes),
                _ => Err(self.columns[column as usize].server),
            }
        });
        let mut total = 0;
        let mut unreachable = Vec::new();
        for answer in futures::future::join_all(asks).await {
            match answer {
                Ok(bytes) => total += bytes,
                Err(server) => unreachable.push(server),
            }
        }
        (total, unreachable)
    }

    /// Tells every column's server the file's metadata (its record, for recovery of a lost
    /// manager store; see `tessera_store::FileRecord`). Best effort: a server that misses it
    /// is told again at the next sync, and recovery reads the record of any column.
    pub async fn describe(&self, client: &Client, committed: bool) {
        let every = 0..self.layout.width;
        self.describe_columns(client, every, committed).await;
    }

    /// [`FileContext::describe`] to `columns` only.
    pub(crate) async fn describe_columns(
        &self,
        client: &Client,
        columns: impl IntoIterator<Item = u32>,
        committed: bool,
    ) {
        let tell =
            (columns.into_iter()).map(|column| self.describe_column(client, column, committed));
        futures::future::join_all(tell).await;
    }

    /// The columns whose servers keep the record of a file written only by this client (a
    /// `put`: pending here, committed by this client, `size` as written): under RAID-0/1/4/5
    /// those holding bytes of `0..size` (its data, mirror and parity units), or every column
    /// for an empty file or Hybrid (whose overflow entries may lie on other columns).
    ///
    /// Why the others need no record: recovery of a lost manager store merges the records
    /// of every server (`tessera_manager::recovery`), so one whole record anywhere restores
    /// the file, and a record gives the file exactly `size`; if every column holding its
    /// bytes is lost, so are the bytes, record or not. The servers holding nothing were only
    /// made to create the file's directory, six empty files and a record, and to sync them.
    pub(crate) fn holding_columns(&self) -> Vec<u32> {
        let layout = &self.layout;
        let every = (0..layout.width).collect();
        if self.meta.size == 0 || self.scheme() == Scheme::Hybrid {
            return every;
        }
        let blocks = self.meta.size.div_ceil(self.unit() as u64);
        // Slots rotate with a period of the width in stripes: past that many blocks, every
        // column the file uses has appeared.
        let period = u64::from(layout.width) * u64::from(layout.width) * 2;
        if blocks > period {
            return every;
        }
        let mut columns = std::collections::BTreeSet::new();
        for block in 0..blocks {
            columns.insert(layout.data_slot(block).column);
            columns.extend(layout.mirror_slot(block).map(|slot| slot.column));
            let stripe = layout.stripe_of_block(block);
            columns.extend(layout.parity_slot(stripe).map(|slot| slot.column));
        }
        columns.into_iter().collect()
    }

    /// Readies the servers of `columns` for calls (keys their datagram sessions, at once;
    /// see `Transport::prepare`). Lost columns are left alone; a failure is met by the call.
    pub(crate) async fn prepare_columns(
        &self,
        client: &Client,
        columns: impl IntoIterator<Item = u32>,
    ) {
        let ready = (columns.into_iter())
            .filter(|&column| !self.lost_entirely(column))
            .map(|column| client.transport.prepare(self.columns[column as usize].addr));
        futures::future::join_all(ready).await;
    }

    pub(crate) async fn describe_column(&self, client: &Client, column: u32, committed: bool) {
        if self.lost_entirely(column) {
            return;
        }
        let request = StorageRequest::Describe {
            meta: self.meta.clone(),
            committed,
        };
        if let Err(fault) = self.rpc(client, column, request, Bytes::new()).await {
            let server = self.columns[column as usize].server;
            tracing::debug!(
                "server {server} did not keep the record of {}: {fault:?}",
                self.meta.path
            );
        }
    }

    /// Sync the file's columns, and renew each one's record of the file (its size grows
    /// with writes); a column that cannot sync owes the whole file. With `manager`, the
    /// manager makes its changes durable too (sizes grown lazily); without, the caller's next
    /// request to it must be one it makes durable (a commit).
    ///
    /// The file's columns are every column, or for a file pending here only those holding
    /// its bytes ([`FileContext::holding_columns`]): no byte of `0..size` lies on the others,
    /// whoever wrote it (a part written by an earlier gateway too), so syncing them would
    /// make only other files durable, and would cost a small put three more servers'
    /// handshakes and syncs.
    pub async fn sync(&self, client: &Client, manager: bool) -> Result<(), ClientError> {
        let columns = if client.pending_files().contains(&self.meta.id) {
            self.holding_columns()
        } else {
            (0..self.layout.width).collect()
        };
        let syncs = columns.into_iter().map(|column| async move {
            if self.lost_entirely(column) {
                return Some(column);
            }
            // Each column keeps its record and syncs in one request: the server syncs the
            // record with the bytes, and each directory once. Whether the file is committed
            // is not known here; a record that knows keeps it.
            let request = StorageRequest::DescribeAndSync {
                meta: self.meta.clone(),
                committed: false,
            };
            match self.rpc(client, column, request, Bytes::new()).await {
                Ok(_) => None,
                Err(_) => Some(column),
            }
        });
        let metadata = async {
            if !manager {
                return Ok::<(), ClientError>(());
            }
            let request = client.sync_request(self.meta.id);
            client.manager_call(request.clone()).await?;
            client.synced(&request);
            Ok(())
        };
        let (failed, metadata) = futures::join!(futures::future::join_all(syncs), metadata);
        metadata?;
        let failed: Vec<u32> = failed.into_iter().flatten().collect();
        if failed.is_empty() {
            return Ok(());
        }
        if self.scheme() == Scheme::Raid0 || failed.len() > 1 {
            return Err(self.unavailable(failed));
        }
        self.report_missed(client, failed[0], IndexRange::new(0, u64::MAX))
            .await
    }
}

/// Send one request to the store `incarnation` at `addr`. An answer from another store (the
/// address was reused) is as good as no answer: the store meant is not there.
pub(crate) async fn call_store(
    client: &Client,
    addr: SocketAddr,
    incarnation: Incarnation,
    request: StorageRequest,
    payload: Bytes,
) -> Result<(StorageResponse, Bytes), TransportError> {
    let reply_bytes = reply_frame_bytes(&request);
    let call = StorageCall {
        incarnation,
        request,
        service: client.service.now(),
    };
    let answer = tessera_transport::call_expecting::<_, StorageResponse>(
        client.transport.as_ref(),
        addr,
        &call,
        payload,
        reply_bytes,
    )
    .await?;
    match answer {
        (StorageResponse::Error(e @ StorageError::WrongStore { .. }), _) => {
            Err(TransportError::Disconnected {
                addr,
                detail: e.to_string(),
            })
        }
        answer => Ok(answer),
    }
}

/// Whether a request may be sent again after a timeout: it reads, or writes bytes that a second
/// copy writes the same (an overflow entry or a record would be appended twice).
fn retry_safe(request: &StorageRequest) -> bool {
    match request {
        // Raising a fence again with its token renews it; lifting it twice lifts nothing more.
        StorageRequest::MirrorFence { .. } | StorageRequest::MirrorRelease { .. } => true,
        StorageRequest::UnderMirrorFence { request, .. } => retry_safe(request),
        _ => matches!(
            request,
            StorageRequest::Read { .. }
                | StorageRequest::Write { .. }
                | StorageRequest::Sync
                | StorageRequest::DescribeAndSync { .. }
                | StorageRequest::OverflowList { .. }
                | StorageRequest::Allocated { .. }
        ),
    }
}

/// The size of the answer frame a request will get if it succeeds, so that the transport can
/// grant it receive budget ahead (an error answer is shorter; a short grant only costs a
/// little time, see `tessera_datagram::grants`). Overflow listings carry at most the bytes
/// asked for, plus their extents.
pub(crate) fn reply_frame_bytes(request: &StorageRequest) -> Option<usize> {
    let data = |len: u64| {
        let message = tessera_wire::encode_message(&StorageResponse::Data).len();
        tessera_wire::FRAME_HEADER_BYTES + message + len as usize
    };
    match request {
        StorageRequest::Read { len, .. }
        | StorageRequest::ReadSnapshot { len, .. }
        | StorageRequest::LockParity { len, .. } => Some(data(u64::from(*len))),
        StorageRequest::OverflowList { len, .. } => Some(data(*len)),
        // Lists whose size is not known ahead.
        StorageRequest::TransportCounters
        | StorageRequest::Allocated { .. }
        | StorageRequest::Records { .. } => None,
        // Everything else is answered in a few bytes: one packet.
        _ => Some(tessera_wire::FRAME_HEADER_BYTES + 16),
    }
}
