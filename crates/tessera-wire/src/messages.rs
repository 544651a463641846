//! The typed messages between clients, storage servers and the manager.

use serde::{Deserialize, Serialize};
use tessera_auth::{Key, KeyId, Role};
use tessera_layout::{Layout, OverflowRole, Region, Scheme};

/// Identifies a file across the cluster (assigned by the manager, never reused).
pub type FileId = u64;
/// Identifies a storage server (assigned by the manager at first registration).
pub type ServerId = u32;
/// Identifies a storage server's on-disk store: random, chosen when the store is created, so
/// that a wiped store, or another cluster's server, is told apart from the one meant.
pub type Incarnation = u64;
/// Identifies a cluster: random, chosen by its manager when its metadata store is created, and
/// remembered by every server that joins, so that a server never joins another cluster whose
/// manager took over its manager's address.
pub type ClusterId = u64;

/// A half-open range of stripes or blocks, `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct IndexRange {
    /// First index in the range.
    pub start: u64,
    /// One past the last index.
    pub end: u64,
}

impl IndexRange {
    /// The range `start..end`.
    pub fn new(start: u64, end: u64) -> Self {
        IndexRange { start, end }
    }

    /// Whether `index` is inside.
    pub fn contains(&self, index: u64) -> bool {
        self.start <= index && index < self.end
    }

    /// Whether the range holds nothing.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// A request addressed to one store. Addresses are reused (a dead server's port may be taken
/// by another server before the manager notices), so a server answers only requests meant for
/// its own store and refuses the rest with [`StorageError::WrongStore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageCall {
    /// The store meant, as the manager knows it.
    pub incarnation: Incarnation,
    /// What to do there.
    pub request: StorageRequest,
    /// When it is due: how the server's queue orders it among others waiting for the disk.
    pub service: Service,
}

/// How a storage server's queue orders a request among those waiting for the disk (Radon's
/// deadline-ordered service, issue 18): reserved requests earliest deadline first, ahead of
/// best effort; rebuild and scrub as best effort under the server's rebuild rate cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Service {
    /// Unreserved traffic: served in arrival order after reserved requests.
    #[default]
    BestEffort,
    /// A reserved stream's request, due `deadline_us` µs after the server receives it (the
    /// end of the stream's period; relative, so that no clocks need to agree). 0: already late.
    Reserved {
        /// µs from arrival to the deadline.
        deadline_us: u64,
    },
    /// Rebuild and scrub: best effort, and at most the server's rebuild rate.
    Background,
}

/// A request from a client to a storage server. Bulk data travels in the frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StorageRequest {
    /// Liveness check; answered with [`StorageResponse::Pong`].
    Ping,
    /// Read `len` bytes at `offset` of a file's data or redundancy file. With `overlay`, the
    /// newest bytes are returned: the data file overlaid with this server's primary overflow
    /// entries (Hybrid). Checksums are verified; a mismatch is [`StorageError::Corrupt`].
    Read {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// Byte offset within that file.
        offset: u64,
        /// Bytes to read.
        len: u32,
        /// Overlay primary overflow entries.
        overlay: bool,
    },
    /// Write the payload at `offset` of the data or redundancy file. With `invalidate_overflow`,
    /// this server's primary overflow entries overlapping the written bytes are trimmed away in
    /// the same step (a Hybrid full-stripe write supersedes them).
    Write {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// Byte offset within that file.
        offset: u64,
        /// Trim primary overflow entries under the written bytes.
        invalidate_overflow: bool,
    },
    /// Lock the parity unit of `stripe` (FIFO queue behind any holder), then return `len`
    /// bytes at `offset` of the redundancy file. Answered with [`StorageResponse::Locked`]: a
    /// fencing token, and any intent record a dead holder left behind (which the new holder
    /// must resolve before anything else). The lock is a lease: held until a `WriteParity`
    /// with `unlock`, an `UnlockParity`, the connection closes, or its holder stays silent
    /// longer than the lease while another locker waits. A wait that cannot be granted
    /// within a bounded time is answered with [`StorageError::LockBusy`].
    LockParity {
        /// File.
        file: FileId,
        /// Stripe whose parity is locked.
        stripe: u64,
        /// Byte offset of the parity unit within the redundancy file.
        offset: u64,
        /// Bytes to return.
        len: u32,
    },
    /// Write the payload as parity at `offset` of the redundancy file, then release the
    /// stripe's lock if `unlock` (waking the next queued locker). The stripe's intent record
    /// is cleared: the holder's parity covers whatever the data columns hold.
    WriteParity {
        /// File.
        file: FileId,
        /// Stripe whose parity is written.
        stripe: u64,
        /// Byte offset in the redundancy file.
        offset: u64,
        /// Release the lock after writing.
        unlock: bool,
        /// The lock's fencing token; a stale one is refused with [`StorageError::StaleLock`].
        token: LockToken,
    },
    /// Release a parity lock without writing (a read-modify-write that failed before writing
    /// any data).
    UnlockParity {
        /// File.
        file: FileId,
        /// Stripe whose lock is released.
        stripe: u64,
        /// The lock's fencing token.
        token: LockToken,
    },
    /// Record durably, under the stripe's lock, what a read-modify-write is about to change
    /// (the payload holds the old bytes of each piece, in order), before any data is
    /// written. The server adds the old parity of the span itself. Renews the lease.
    RecordIntent {
        /// File.
        file: FileId,
        /// Stripe being written.
        stripe: u64,
        /// The lock's fencing token.
        token: LockToken,
        /// What is written where.
        intent: ParityIntent,
    },
    /// Keep holding the stripe's lock (the lease is renewed).
    RenewParity {
        /// File.
        file: FileId,
        /// Stripe whose lock is renewed.
        stripe: u64,
        /// The lock's fencing token.
        token: LockToken,
    },
    /// The stripe's unresolved intent record, if any, and whether it is under a stale-parity
    /// record, without locking (a live record, a full-stripe write in flight, is waited out
    /// first, for a bounded time; `waited` says so): answered with [`StorageResponse::Intent`], whose payload is
    /// the old parity then the old data.
    ReadIntent {
        /// File.
        file: FileId,
        /// Stripe.
        stripe: u64,
    },
    /// Append the payload to the overflow region as an entry covering `offset..offset+len` of
    /// the primary column's data file. Overflow entries are addressed by that offset whatever
    /// the role: the mirror column keeps them under the primary's offsets.
    OverflowWrite {
        /// File.
        file: FileId,
        /// Primary or mirror copy.
        role: OverflowRole,
        /// Byte offset in the primary column's data file.
        offset: u64,
    },
    /// Trim overflow entries of `role` away from `offset..offset+len`.
    OverflowInvalidate {
        /// File.
        file: FileId,
        /// Primary or mirror entries.
        role: OverflowRole,
        /// Byte offset in the primary column's data file.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// List live overflow entries of `role` overlapping `offset..offset+len`, clipped to it,
    /// oldest first; their bytes are concatenated in the payload.
    OverflowList {
        /// File.
        file: FileId,
        /// Primary or mirror entries.
        role: OverflowRole,
        /// Byte offset in the primary column's data file.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Make everything written so far durable (fdatasync) before answering.
    Sync,
    /// Delete everything stored for a file.
    Remove {
        /// File.
        file: FileId,
    },
    /// Bytes this server stores for a file: data, redundancy and live overflow.
    Usage {
        /// File.
        file: FileId,
    },
    /// The counters of the server's datagram transport (metrics, experiments).
    TransportCounters,
    /// Byte ranges of `offset..offset+len` of a file's data or redundancy file that may hold
    /// written bytes (for the data file, also those covered by overflow entries of either
    /// role); everything outside reads as zeros. Answered with [`StorageResponse::Allocated`].
    /// Scrub and rebuild walk only these, not the holes of a sparse file.
    Allocated {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// Byte offset within that file.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Keep this metadata of a file this server holds a column of (durably, before
    /// answering), so that a lost manager store can be rebuilt from the servers
    /// (`tessera manager recover`). The server adds the cluster it joined.
    Describe {
        /// The file as the manager last told the client.
        meta: FileMeta,
        /// The file is known to be committed (created whole, or an atomic replace's file
        /// after its commit); false means not known to be, which never undoes a true.
        committed: bool,
    },
    /// The file records this server keeps, in file id order, starting after `after`, at most
    /// [`RECORDS_PER_PAGE`] at a time. Answered whatever store the call names: the answer says
    /// which store it came from (recovery does not know the incarnations yet).
    Records {
        /// List files with an id above this one.
        after: FileId,
    },
    /// Record durably that parity of `stripes` (those whose parity this server holds) may
    /// not match their data: a full-stripe write is about to start. Answered with
    /// [`StorageResponse::StaleRecorded`] once the record is on disk; the writer writes no
    /// data before. Leased like a parity lock (renewed with `RenewStale`).
    RecordStale {
        /// File.
        file: FileId,
        /// Stripes about to be written whole.
        stripes: IndexRange,
    },
    /// Keep a stale-parity record live (its writes are still out).
    RenewStale {
        /// File.
        file: FileId,
        /// The record's token; an unknown one is refused with [`StorageError::StaleLock`].
        token: StaleToken,
    },
    /// Delete stale-parity record `token` (all its writes were answered), if given, and take
    /// `stripes` out of every *orphaned* record of the file (their parity was just computed
    /// from the data). Records whose writer still renews them are left alone.
    ClearStale {
        /// File.
        file: FileId,
        /// The writer's own record.
        token: Option<StaleToken>,
        /// Stripes whose parity now matches their data.
        stripes: IndexRange,
    },
    /// The stripes under stale-parity records whose writer stopped renewing them (torn
    /// stripes of interrupted full-stripe writes), at most [`STALE_LIST_MAX`] ranges:
    /// answered with [`StorageResponse::StaleList`]. A resolver locks each stripe, which hands
    /// it the orphaned record to resolve.
    ListStale,
    /// Copy-on-write snapshots (see `tessera-store`'s `snapshot` module): from now on, the
    /// first write to each block of these files copies the block's bytes aside for snapshot
    /// `epoch` before overwriting it. Durable before the answer ([`StorageResponse::Done`]).
    /// Refused unless this server holds the snapshot's fence of every file
    /// ([`StorageRequest::SnapshotFence`]).
    SnapshotBegin {
        /// The snapshot's epoch (the manager's counter, increasing).
        epoch: u64,
        /// Files of the snapshot this server holds a column of.
        files: Vec<FileId>,
    },
    /// Read as [`StorageRequest::Read`] with `overlay`, as the bytes stood when snapshot
    /// `epoch` began here. A block this server cannot give for that snapshot (it was not told
    /// of the snapshot: a wiped store) is refused as [`StorageError::Corrupt`], so that the
    /// client reconstructs it from the other columns.
    ReadSnapshot {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// Byte offset within that file.
        offset: u64,
        /// Bytes to read.
        len: u32,
        /// The snapshot's epoch.
        epoch: u64,
    },
    /// Snapshot `epoch` was removed: delete the copies of `file` no snapshot in `live` (the
    /// file's snapshots still kept) reads any more.
    SnapshotDrop {
        /// File.
        file: FileId,
        /// The removed snapshot's epoch.
        epoch: u64,
        /// Epochs of the snapshots of the file still kept.
        live: Vec<u64>,
    },
    /// Bytes of copies this server keeps for snapshots of a file: answered with
    /// [`StorageResponse::Usage`].
    SnapshotUsage {
        /// File.
        file: FileId,
    },
    /// The first step of taking snapshot `epoch` (see `tessera-store`'s `snapshot` module):
    /// stop new writes of these files from starting here (parity locks wait, stale-parity
    /// records are refused with [`StorageError::LockBusy`]) and answer
    /// [`StorageResponse::Done`] once the writes in flight on stripes whose parity this server
    /// holds are finished. The fence lapses by itself ([`SNAPSHOT_FENCE_LEASE_MS`]) if
    /// [`StorageRequest::SnapshotRelease`] does not come. Protocol version 8.
    SnapshotFence {
        /// The snapshot's epoch.
        epoch: u64,
        /// Files of the snapshot this server holds a column of.
        files: Vec<FileId>,
    },
    /// The last step of taking snapshot `epoch`: lift its fence of these files.
    SnapshotRelease {
        /// The snapshot's epoch.
        epoch: u64,
        /// Files fenced for it.
        files: Vec<FileId>,
    },
    /// Discard everything stored in `region` of `file` from byte `from` on (a multiple of
    /// 4 KiB), and for the data file the primary overflow entries from there on: it reads as
    /// zeros after. Blocks a snapshot of the file still reads are copied first. Refused with
    /// [`StorageError::WritesInFlight`] while an intent record of the file is unresolved here
    /// (the caller then writes zeros, which resolves it), and with
    /// [`StorageError::NotFenced`] unless the caller's fence of the file stands here
    /// ([`StorageRequest::SnapshotFence`] with epoch `fence`): no write of the file is then
    /// in flight, so no read-modify-write can mix discarded and kept bytes into its parity.
    /// Protocol version 12.
    Discard {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// First byte discarded.
        from: u64,
        /// The epoch of the caller's fence of the file.
        fence: u64,
    },
    /// [`StorageRequest::RecordStale`] for a discard: parity of `stripes` (those whose parity
    /// this server holds) may not match their data from now on, because the caller, under
    /// its fence `fence` of the file, is about to discard them column by column. Taken while
    /// the fence stands (a plain `RecordStale` is refused then), and refused with
    /// [`StorageError::NotFenced`] unless it stands. A caller that dies part-way leaves the
    /// record to be orphaned and resolved like a torn full-stripe write's. Protocol version 12.
    RecordDiscard {
        /// File.
        file: FileId,
        /// Stripes about to be discarded.
        stripes: IndexRange,
        /// The epoch of the caller's fence of the file.
        fence: u64,
    },
    /// [`StorageRequest::Describe`] and [`StorageRequest::Sync`] in one request: keep this
    /// record of the file and make everything written so far durable, answered once both are.
    /// The server syncs the record with the written files in one batch and each directory
    /// owed once (a put's record and bytes cost one round of syncs where the two requests
    /// cost two). Protocol version 15.
    DescribeAndSync {
        /// The file as the manager last told the client.
        meta: FileMeta,
        /// The file is known to be committed; false means not known to be, which never
        /// undoes a true.
        committed: bool,
    },
    /// The bytes of `file` this store kept when it renewed itself after a power loss with
    /// answered writes not synced (`tessera-store`'s `kept` module): asked about, put back
    /// in place of what the store holds of the file now, or deleted, as `action` says.
    /// Answered with [`StorageResponse::Kept`]. Appended in protocol version 15.
    KeptBytes {
        /// File.
        file: FileId,
        /// What to do with them.
        action: KeptAction,
    },
    /// Hold back every write of `file` here (`Write`, `OverflowWrite`, `OverflowInvalidate`,
    /// `Discard`) that is not made under this fence: it waits until
    /// [`StorageRequest::MirrorRelease`] or until the fence lapses
    /// ([`MIRROR_FENCE_LEASE_MS`]). Answered [`StorageResponse::Done`] once raised; a fence of
    /// the file that another caller holds is waited out first (within the lease, then
    /// [`StorageError::FenceBusy`]). A scrub raises it at the column whose copy it is about to
    /// repair from the other copy, so that no write lands there between its read of the
    /// other copy and its repair (`tessera-client`'s `maintain` module argues why that makes
    /// the repair safe against live writers). Appended in protocol version 16.
    MirrorFence {
        /// File.
        file: FileId,
        /// The caller's token for this fence (random; names it in the requests below).
        fence: u64,
    },
    /// Lifts the fence `fence` of `file` (nothing if it lapsed or never stood). Protocol
    /// version 16.
    MirrorRelease {
        /// File.
        file: FileId,
        /// The fence's token.
        fence: u64,
    },
    /// Repairs only the *bad* parts of `role`'s overflow entries of `file` in
    /// `offset..offset+len` (those a damaged log record may have changed, and entries whose
    /// bytes fail their checksum) from the other copy's `entries` there, in offset order,
    /// their bytes back to back in the payload. Every part that verifies stays as it is:
    /// entries written there since the damage decide those bytes, and may be newer than the
    /// other copy's (a write whose other copy is still on the way). Protocol version 16.
    OverflowRepairDamaged {
        /// File.
        file: FileId,
        /// Whose entries are repaired.
        role: OverflowRole,
        /// First byte of the range, in the primary column's data file.
        offset: u64,
        /// Bytes in the range.
        len: u64,
        /// The other copy's entries in the range.
        entries: Vec<OverflowExtent>,
    },
    /// `request`, a `Write`, `OverflowWrite` or `OverflowInvalidate`, made under the caller's
    /// fence `fence` of the file it writes: not held back by it, and refused with
    /// [`StorageError::NotFenced`] unless that fence stands (a repair whose fence lapsed
    /// could otherwise land over a write that the fence no longer held back). Protocol
    /// version 16.
    UnderMirrorFence {
        /// The caller's fence token.
        fence: u64,
        /// The write.
        request: Box<StorageRequest>,
    },
}

/// How long a [`StorageRequest::MirrorFence`] stands unless released, in milliseconds: a
/// scrub's repair under it takes a few round trips; a scrub that dies holds writes of the file
/// back at one server for no longer than this.
pub const MIRROR_FENCE_LEASE_MS: u64 = 1000;

/// What [`StorageRequest::KeptBytes`] does with a file's kept bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeptAction {
    /// Only say whether there are any.
    Ask,
    /// Put them back as the file's bytes here (its current bytes and records go).
    Restore,
    /// Delete them: the file was rebuilt from the other servers.
    Drop,
}

/// How long a [`StorageRequest::SnapshotFence`] stands at a server unless released, in
/// milliseconds: the client that takes a snapshot begins it everywhere within this of sending
/// its first fence, or gives up.
pub const SNAPSHOT_FENCE_LEASE_MS: u64 = 3000;

/// A stale-parity record's token: names one record at a server.
pub type StaleToken = u64;

/// Most ranges one `ListStale` answer holds.
pub const STALE_LIST_MAX: usize = 1024;

/// Most ranges one [`StorageResponse::Allocated`] lists; past it, the last range runs to the
/// end of the range asked for (a superset, never a subset, of what is allocated).
pub const ALLOCATED_RANGES_MAX: usize = 4096;

/// Most file records in one [`StorageResponse::Records`] (a path is at most 4 KiB, so a page
/// stays far below the message bound).
pub const RECORDS_PER_PAGE: usize = 256;

/// One overflow entry in a listing; its bytes follow in the payload in listing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverflowExtent {
    /// Byte offset in the primary column's data file.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// A parity lock's fencing token: increases with every grant at a server, so a holder whose
/// lease was broken is told apart from the one holding the lock now.
pub type LockToken = u64;

/// What a RAID-4/5 read-modify-write is about to change in one stripe, recorded at the parity
/// server before the data is written: the span of the parity unit it touches and the data
/// pieces inside it. Stored with the span's old parity and the pieces' old bytes, it tells how
/// to make parity consistent with whatever the data columns hold if the writer dies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParityIntent {
    /// Byte offset of the stripe's parity unit in the redundancy file.
    pub unit_offset: u64,
    /// First byte of the span within the unit.
    pub span_start: u32,
    /// Bytes in the span.
    pub span_len: u32,
    /// The pieces written, in payload order; each lies inside the span.
    pub pieces: Vec<IntentPiece>,
}

/// One data piece of a [`ParityIntent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentPiece {
    /// Column of the stripe whose data unit is written.
    pub column: u32,
    /// First byte within the unit.
    pub offset_in_unit: u32,
    /// Bytes.
    pub len: u32,
}

impl ParityIntent {
    /// Whether the pieces lie inside the span and the span inside a unit of `unit_bytes`.
    pub fn is_well_formed(&self, unit_bytes: u64) -> bool {
        let span_end = u64::from(self.span_start) + u64::from(self.span_len);
        span_end <= unit_bytes
            && self.pieces.iter().all(|p| {
                p.offset_in_unit >= self.span_start
                    && u64::from(p.offset_in_unit) + u64::from(p.len) <= span_end
            })
    }

    /// Bytes of old data the record carries: the sum of the pieces' lengths.
    pub fn old_data_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.len)).sum()
    }
}

/// A storage server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StorageResponse {
    /// Done; nothing to return.
    Done,
    /// The requested bytes are in the payload.
    Data,
    /// Overflow entries; their bytes are concatenated in the payload.
    Overflow {
        /// The entries, oldest first.
        entries: Vec<OverflowExtent>,
    },
    /// Bytes stored for a file.
    Usage {
        /// Data, redundancy and live overflow bytes.
        stored_bytes: u64,
    },
    /// Answer to `Ping`.
    Pong {
        /// The server's id, once registered.
        server: Option<ServerId>,
    },
    /// The request failed.
    Error(StorageError),
    /// Answer to `LockParity`: the lock is held; the parity bytes asked for are in the
    /// payload, followed by the old parity and old data of `intent` if a dead holder left one.
    Locked {
        /// The lock's fencing token.
        token: LockToken,
        /// An intent record left by a holder whose lease was broken, unresolved.
        intent: Option<ParityIntent>,
        /// The stripe is under an orphaned stale-parity record (an interrupted full-stripe
        /// write): parity must be recomputed from the data before it is used.
        stale: bool,
    },
    /// Answer to `ListStale`.
    StaleList {
        /// File and range of stripes, per orphaned record's range.
        ranges: Vec<(FileId, IndexRange)>,
    },
    /// Answer to `ReadIntent`: the record, and its old parity then old data in the payload.
    Intent {
        /// The stripe's unresolved intent record, if any.
        intent: Option<ParityIntent>,
        /// The stripe is under an orphaned stale-parity record (an interrupted full-stripe
        /// write): its parity cannot be trusted to reconstruct a data column.
        stale: bool,
        /// A live record covered the stripe when asked, and the answer waited until it was
        /// cleared or orphaned, or for as long as the server waits: whatever the asker read
        /// of the stripe before may be half of that write, so it reads again and asks again.
        waited: bool,
        /// The stripe's generation, read after the records: it changes before a record of
        /// a write to the stripe is deleted, so a reader that asked before and after its
        /// reads and got the same one saw no write complete in between.
        generation: u64,
    },
    /// Answer to `RecordStale`: the record is durable.
    StaleRecorded {
        /// The record's token, for `RenewStale` and `ClearStale`.
        token: StaleToken,
    },
    /// Answer to `TransportCounters`: each counter by name; none if the server serves TCP
    /// only.
    Counters {
        /// Name and value of each counter.
        counters: Vec<(String, u64)>,
    },
    /// Answer to `Allocated`: byte ranges, sorted, disjoint, at most [`ALLOCATED_RANGES_MAX`].
    Allocated {
        /// The ranges that may hold written bytes.
        ranges: Vec<IndexRange>,
    },
    /// Answer to `Records`: who this server is, and a page of its file records.
    Records {
        /// The server's id, once registered.
        server: Option<ServerId>,
        /// Its store.
        incarnation: Incarnation,
        /// The cluster its store joined, once registered.
        cluster: Option<ClusterId>,
        /// Records in file id order, each as the manager last described the file.
        records: Vec<FileMeta>,
        /// Files whose record is damaged (failed its checksum or did not decode).
        damaged: Vec<FileId>,
        /// Files stored without a record: not in the namespace, but their ids are taken.
        unrecorded: Vec<FileId>,
        /// Files among `records` never recorded as committed (pending files of a `put`).
        uncommitted: Vec<FileId>,
        /// Whether more records follow this page.
        more: bool,
    },
    /// Answer to `KeptBytes`: whether the store kept bytes of the file (before the action).
    Kept {
        /// Kept bytes of the file were there.
        present: bool,
    },
}

/// Why a storage request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StorageError {
    /// A stored block, overflow entry or overflow log record failed its checksum: the bytes on
    /// disk are not what was written (the client reads from redundancy and repairs).
    #[error("corrupt block at {region:?} offset {offset} of file {file}")]
    Corrupt {
        /// File.
        file: FileId,
        /// Data or redundancy file.
        region: Region,
        /// Byte offset of the bad block.
        offset: u64,
    },
    /// The server's disk failed the operation.
    #[error("disk error: {detail}")]
    Disk {
        /// What the OS said.
        detail: String,
    },
    /// The request is malformed or out of bounds.
    #[error("bad request: {detail}")]
    BadRequest {
        /// What is wrong.
        detail: String,
    },
    /// The parity lock's token is not the holder's: the lock was released, or its lease was
    /// broken and the lock handed to another client. Nothing was written.
    #[error("parity lock of stripe {stripe} is no longer held with token {token}")]
    StaleLock {
        /// Stripe.
        stripe: u64,
        /// The token presented.
        token: LockToken,
    },
    /// The parity lock could not be granted within the server's bound on waiting (other
    /// clients hold it); the server is fine, ask again.
    #[error("parity lock of stripe {stripe} is busy")]
    LockBusy {
        /// Stripe.
        stripe: u64,
    },
    /// The request was meant for another store: the address now belongs to another server
    /// (or to this one with a wiped store). Nothing was done.
    #[error("the server here has store {found:#x}, not store {wanted:#x}: the address was reused")]
    WrongStore {
        /// The store the request named.
        wanted: Incarnation,
        /// The store this server has.
        found: Incarnation,
    },
    /// A snapshot of the file is being taken here: new writes of it wait until it is begun
    /// (a few milliseconds); nothing was done, ask again. Protocol version 8.
    #[error("a snapshot of file {file} is being taken; ask again")]
    Fenced {
        /// File.
        file: FileId,
    },
    /// Writes of the file in flight here did not finish within the server's bound for
    /// fencing a snapshot (or left a torn stripe not yet resolved): the snapshot is not
    /// taken; take it again.
    #[error("writes of file {file} in flight here did not finish in time for the snapshot")]
    WritesInFlight {
        /// File.
        file: FileId,
    },
    /// `SnapshotBegin` for a file whose fence for that snapshot is not standing here (it
    /// lapsed, or was never raised): beginning it now could split a write in flight. Also a
    /// write under a mirror fence (`UnderMirrorFence`, `epoch` then the fence's token) that
    /// no longer stands.
    #[error("snapshot {epoch} of file {file} is not fenced here")]
    NotFenced {
        /// File.
        file: FileId,
        /// The snapshot's epoch.
        epoch: u64,
    },
    /// The manager removed the file and this server deleted its data (it keeps the id as a
    /// tombstone): a write that would make the file again is refused, since no file in the
    /// namespace could own its bytes. The writer was stalled past its pending file's lease, or
    /// wrote to a file removed under it. Nothing was written.
    #[error("file {file} was removed (its pending lease ran out, or it was deleted)")]
    Removed {
        /// File.
        file: FileId,
    },
    /// Another caller's mirror fence of the file stood here for longer than a fence may be
    /// waited for (`StorageRequest::MirrorFence`); nothing was done, ask again. Appended in
    /// protocol version 16.
    #[error("another scrub holds writes of file {file} back here; ask again")]
    FenceBusy {
        /// File.
        file: FileId,
    },
}

/// State of a storage server as the manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServerState {
    /// Heartbeating and whole.
    Up,
    /// No heartbeat within the timeout, or reported unreachable.
    Down,
    /// Heartbeating, but owes a resync of regions it missed; those regions count as lost.
    Stale,
}

impl ServerState {
    /// Lower-case name, as `status --json` prints it.
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Up => "up",
            ServerState::Down => "down",
            ServerState::Stale => "stale",
        }
    }
}

/// A storage server's record at the manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Server id.
    pub id: ServerId,
    /// Address clients reach it at.
    pub addr: String,
    /// Its store, as last registered; requests name it.
    pub incarnation: Incarnation,
    /// Up, down or stale.
    pub state: ServerState,
}

/// A file's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// File id, used on the storage servers.
    pub id: FileId,
    /// Path in the namespace.
    pub path: String,
    /// Scheme, stripe unit, width.
    pub layout: Layout,
    /// Server of each column, `layout.width` long.
    pub servers: Vec<ServerId>,
    /// Size in bytes.
    pub size: u64,
}

/// Stripes a column owes because its server missed writes to them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissedStripes {
    /// Server that missed them.
    pub server: ServerId,
    /// Stripe ranges, sorted and disjoint.
    pub stripes: Vec<IndexRange>,
}

/// Everything a client needs to do I/O on a file: layout, servers and what counts as lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileView {
    /// The file.
    pub meta: FileMeta,
    /// Status of each column's server, in column order.
    pub columns: Vec<ServerStatus>,
    /// Stripes of this file that servers missed and still owe.
    pub missed: Vec<MissedStripes>,
}

/// How to choose a new file's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRequest {
    /// Redundancy scheme.
    pub scheme: Scheme,
    /// Bytes per stripe unit.
    pub stripe_unit: u32,
    /// Number of servers; `None` means all servers that are up.
    pub width: Option<u32>,
}

/// A request to the metadata manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManagerRequest {
    /// A storage server announces itself. `server` is its id if it has one; `incarnation`
    /// identifies its store, and changes when the store was wiped.
    Register {
        /// Known id, if any.
        server: Option<ServerId>,
        /// Address clients reach it at.
        addr: String,
        /// Random id of the server's on-disk store.
        incarnation: Incarnation,
        /// The cluster the store joined, if it joined one: a manager of another refuses it.
        cluster: Option<ClusterId>,
    },
    /// A storage server is alive.
    Heartbeat {
        /// Server id.
        server: ServerId,
        /// Id of its on-disk store.
        incarnation: Incarnation,
        /// The cluster the store joined.
        cluster: ClusterId,
    },
    /// Create a file (replacing an existing one if `replace`).
    Create {
        /// Path.
        path: String,
        /// Layout wanted.
        layout: LayoutRequest,
        /// Replace an existing file of that path.
        replace: bool,
    },
    /// Look a file up for I/O.
    Lookup {
        /// Path.
        path: String,
    },
    /// Look a file up by id.
    LookupId {
        /// File id.
        file: FileId,
    },
    /// List files whose path starts with `prefix`.
    List {
        /// Path prefix.
        prefix: String,
    },
    /// Remove a file from the namespace; answered with its metadata so the caller can delete
    /// its data on the servers.
    Remove {
        /// Path.
        path: String,
    },
    /// Set a file's size: to `size` exactly, or to at least `size` if `grow_only`.
    SetSize {
        /// File.
        file: FileId,
        /// New size.
        size: u64,
        /// Only ever grow.
        grow_only: bool,
    },
    /// A server missed writes to these stripes of a file; it becomes stale for them.
    ReportMissed {
        /// Server that missed the writes.
        server: ServerId,
        /// File.
        file: FileId,
        /// Stripes missed.
        stripes: IndexRange,
    },
    /// A client could not reach a server.
    ReportDown {
        /// Server.
        server: ServerId,
    },
    /// The cluster's servers.
    Status,
    /// Files that have `server` in their layout, with what it owes of each.
    FilesOnServer {
        /// Server.
        server: ServerId,
    },
    /// Make every metadata change so far durable (sizes are grown lazily, like a file system
    /// that persists a file's size at fsync).
    Sync,
    /// The server has been resynced for these stripes of a file. Refused with
    /// [`ManagerError::DebtChanged`] unless the debt's tag is still `tag` (no miss was
    /// reported since the rebuild listed it).
    Resynced {
        /// Server.
        server: ServerId,
        /// File.
        file: FileId,
        /// Stripes now whole.
        stripes: IndexRange,
        /// The debt's tag as listed ([`FileDebt::tag`]).
        tag: u64,
    },
    /// Create a new, unnamed file that will take `path` when committed (an atomic replace):
    /// it is invisible to `Lookup` and `List` until [`ManagerRequest::CommitPending`], and
    /// removed with its data if it is not committed within its lease. Answered with
    /// [`ManagerResponse::Pending`].
    CreatePending {
        /// The path it will take.
        path: String,
        /// Layout wanted.
        layout: LayoutRequest,
    },
    /// Keep a pending file alive for another lease (any `LookupId` or `SetSize` of it does too).
    RenewPending {
        /// The pending file.
        file: FileId,
    },
    /// Give a pending file its path, in one transaction removing the file that had it; answered
    /// with [`ManagerResponse::Committed`].
    CommitPending {
        /// The pending file.
        file: FileId,
    },
    /// Remove a pending file that will not be committed; answered with its metadata so the
    /// caller can delete its data on the servers.
    AbandonPending {
        /// The pending file.
        file: FileId,
    },
    /// Files removed from the namespace whose data `server` may still hold; answered with
    /// [`ManagerResponse::Orphans`]. Servers ask, delete them, and say so with
    /// [`ManagerRequest::OrphansRemoved`].
    Orphans {
        /// The server asking.
        server: ServerId,
    },
    /// `server` deleted its data of these removed files.
    OrphansRemoved {
        /// The server.
        server: ServerId,
        /// The files it deleted.
        files: Vec<FileId>,
    },
    /// Issue a new client access key (admin only).
    KeyCreate {
        /// A name for the operator's records (who or what holds the key).
        name: String,
    },
    /// The access keys issued and not revoked, without their secrets (admin only).
    KeyList,
    /// Revoke an access key (admin only): its holder is refused from then on.
    KeyRemove {
        /// The key.
        key: KeyId,
    },
    /// The storage keys of the live access keys, for a storage server to check clients by
    /// (server only).
    StorageKeys,
    /// `request`, applied at most once however often it is retried: a replicated manager
    /// remembers the answer to each client's latest `sequence` and gives it again to a retry
    /// (sent to another replica after a failover) instead of applying it twice. The role
    /// needed is `request`'s.
    Once {
        /// The client, drawn at random when it starts.
        client: u64,
        /// The request's number in the client's order, from 1.
        sequence: u64,
        /// The request.
        request: Box<ManagerRequest>,
    },
    /// The state of the replica asked (any role): answered with [`ManagerResponse::Replica`].
    Replica,
    /// A piece of a copy of a replica's store and the order position it stands at, for a
    /// replica that restarted to catch up from (admin only; the piece travels in the frame's
    /// payload). With `at` empty the replica makes a new copy and sends its first piece; with
    /// `at` the pieces of the copy made at that position, from `offset`, so a store of any
    /// size crosses in frames of at most `max_bytes`. Answered with
    /// [`ManagerResponse::Snapshot`].
    Snapshot {
        /// The position of the copy to read, or none for a new copy.
        at: Option<u64>,
        /// Where in the copy the piece starts.
        offset: u64,
        /// Longest piece wanted (the replica may send less).
        max_bytes: u32,
    },
    /// A change to, or a question about, the directory tree (directories, renames, times).
    Namespace(crate::NamespaceRequest),
    /// Reserve `rate_bytes_per_s` for a stream of `file` (Radon, issue 18). Admitted only if,
    /// on the link of every server holding a column of the file, the reservations admitted
    /// stay within the reservable share of the link; each server's link carries the rate over
    /// the file's data columns. Answered with [`ManagerResponse::Reserved`], or
    /// [`ManagerError::ReservationRefused`] naming the link.
    Reserve {
        /// The file streamed.
        file: FileId,
        /// The stream's rate.
        rate_bytes_per_s: u64,
    },
    /// Keep a reservation for another lease.
    RenewReservation {
        /// The reservation.
        id: u64,
    },
    /// Give a reservation back (the stream ended).
    ReleaseReservation {
        /// The reservation.
        id: u64,
    },
    /// Take a snapshot named `name` of the files whose path starts with `prefix`: records
    /// their metadata as it stands now and a new epoch, the snapshot not yet readable.
    /// Answered with [`ManagerResponse::Snapshots`] holding it; the caller tells each server
    /// ([`StorageRequest::SnapshotBegin`]), then sends [`ManagerRequest::SnapshotReady`].
    SnapshotCreate {
        /// Its name.
        name: String,
        /// Path prefix of the files it holds.
        prefix: String,
    },
    /// Every server was told of snapshot `name`: it is readable from now on.
    SnapshotReady {
        /// Its name.
        name: String,
    },
    /// The snapshots, without their files (with `name`, only that one, with its files):
    /// answered with [`ManagerResponse::Snapshots`].
    SnapshotList {
        /// Only this snapshot, with its files.
        name: Option<String>,
    },
    /// Remove snapshot `name`: answered with [`ManagerResponse::Snapshots`] holding it (the
    /// caller tells the servers to drop its copies) and the files removed with it
    /// ([`ManagerResponse::SnapshotRemoved`]).
    SnapshotRemove {
        /// Its name.
        name: String,
    },
    /// [`ManagerRequest::CommitPending`] with the file's size set to `size` in the same
    /// transaction, so that a writer that tracked the size itself needs no `SetSize` and no
    /// `Sync` first (the commit is durable); answered with [`ManagerResponse::Committed`].
    CommitPendingSized {
        /// The pending file.
        file: FileId,
        /// Its size, exactly.
        size: u64,
    },
    /// Add replica `id` listening at `addr` to a replicated manager's group, or remove it
    /// (`addr` empty): an ordered change of the group, one replica at a time (admin only).
    /// Answered with [`ManagerResponse::ReplicaGroup`] once the replica asked applied the
    /// change; asked again, a change already made is answered the same.
    ReplicaChange {
        /// The replica (1-based; order node `id - 1`).
        id: u16,
        /// Where it listens (TCP, and UDP at the same port), for an addition.
        addr: Option<String>,
    },
    /// The replica group as this replica's store records it (any role): answered with
    /// [`ManagerResponse::ReplicaGroup`].
    ReplicaGroup,
    /// [`ManagerRequest::Sync`] that also grows `file` to at least `size` (if it still
    /// exists) in the durable commit: the size this client's writes gave it with
    /// `SetSize { grow_only }`, committed without sync. A manager (or every replica) that
    /// crashed after answering that grow lost it; restated here, the sync cannot acknowledge
    /// a size it no longer has. Answered with [`ManagerResponse::Done`].
    SyncFile {
        /// The file whose writes are being synced.
        file: FileId,
        /// The least size its writes gave it.
        size: u64,
    },
}

/// A manager replica as `tessera status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// Its id (1-based, in the order of `--peers`); 0 for a manager that is not replicated.
    pub id: u16,
    /// "single", "leader", "follower", "starting", "catching-up" or "view-change".
    pub role: String,
    /// Its view of the total order group.
    pub view: u64,
    /// Commands it has applied (the next order position it applies) in `epoch`.
    pub applied: u64,
    /// How many times the whole group started (the order's positions start again at 0).
    pub epoch: u64,
}

/// A file and what its server owes of it, for rebuild.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDebt {
    /// The file.
    pub meta: FileMeta,
    /// Stripes the server owes, sorted and disjoint; a wiped store owes `0..u64::MAX`.
    pub missed: Vec<IndexRange>,
    /// Changes with every miss reported for the debt, even of stripes already owed (never
    /// the same twice): a rebuild's `Resynced` names it, so that a write that skipped the
    /// server while it was being rebuilt is not forgotten.
    pub tag: u64,
}

/// The manager's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManagerResponse {
    /// Done.
    Done,
    /// A server's id after registration, and its state.
    Registered {
        /// Id assigned or confirmed.
        server: ServerId,
        /// State the manager holds for it.
        state: ServerState,
        /// The manager's cluster, for the server to remember.
        cluster: ClusterId,
    },
    /// A file, ready for I/O.
    File(FileView),
    /// A file's metadata (after removal).
    Meta(FileMeta),
    /// Files matching a listing.
    Files(Vec<FileMeta>),
    /// The cluster's servers.
    Servers(Vec<ServerStatus>),
    /// Files on a server and its debts.
    Debts(Vec<FileDebt>),
    /// The request failed.
    Error(ManagerError),
    /// A pending file, ready for I/O, and how long it lives without a renewal.
    Pending {
        /// The file (its path is the one it will take).
        view: FileView,
        /// Its lease in milliseconds: renew it well within this.
        lease_ms: u64,
    },
    /// A pending file took its path.
    Committed {
        /// The file that had the path before, whose data is now to be deleted.
        replaced: Option<FileMeta>,
    },
    /// Removed files whose data a server may still hold (at most [`ORPHANS_LISTED_MAX`]).
    Orphans(Vec<FileId>),
    /// A new access key: give `key` to its holder, it is not shown again.
    KeyCreated {
        /// Its id.
        id: KeyId,
        /// Its secret.
        key: Key,
    },
    /// The access keys issued and not revoked.
    Keys(Vec<AccessKeyInfo>),
    /// The storage key of every live access key.
    StorageKeys(Vec<(KeyId, Key)>),
    /// A replica's state.
    Replica(ReplicaStatus),
    /// A piece (in the payload) of a copy of a replica's store as it stands after applying
    /// every order position below `position`.
    Snapshot {
        /// The next order position the copied store would apply.
        position: u64,
        /// The length of the whole copy.
        total_bytes: u64,
        /// Where in the copy the piece starts.
        offset: u64,
    },
    /// What a path names (`None`: nothing).
    Entry(Option<crate::NamespaceEntry>),
    /// A directory's entries.
    Dir(crate::DirListing),
    /// A reservation admitted, and how long it lives without a renewal.
    Reserved {
        /// Its id, for renewing and releasing it.
        id: u64,
        /// Its lease in milliseconds: renew it well within this.
        lease_ms: u64,
    },
    /// Snapshots of files.
    Snapshots(Vec<SnapshotInfo>),
    /// A removed snapshot, and the files removed from the namespace before that only it
    /// still held, whose data is now to be deleted (as after [`ManagerRequest::Remove`]).
    SnapshotRemoved {
        /// The snapshot, with its files.
        snapshot: SnapshotInfo,
        /// For each of its files, the epochs of the other snapshots still holding it.
        live: Vec<(FileId, Vec<u64>)>,
        /// Files whose data to delete now.
        freed: Vec<FileMeta>,
    },
    /// The file left the namespace, but snapshots still hold it: its data stays on the
    /// servers until the last of them is removed.
    Retained(FileMeta),
    /// A replicated manager's group: the number of changes applied since the group's
    /// start (the order's group epoch) and each member's id and address.
    ReplicaGroup {
        /// Group changes applied since the whole group last started.
        epoch: u32,
        /// The members, by id.
        members: Vec<(u16, String)>,
    },
}

/// A copy-on-write snapshot of files, as the manager keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// Its epoch: the servers keep the copies made for it under this number.
    pub epoch: u64,
    /// Path prefix of the files it holds.
    pub prefix: String,
    /// Every server was told of it: it is readable.
    pub ready: bool,
    /// Its files as they stood when it was taken (with the stripes their servers owed then,
    /// which count as lost for reads of it); empty in a listing of every snapshot.
    pub files: Vec<SnapshotFile>,
    /// How many files it holds.
    pub file_count: u64,
    /// Bytes of its files (their sizes when it was taken).
    pub bytes: u64,
}

/// A file as a snapshot holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    /// Its metadata at the snapshot's moment.
    pub meta: FileMeta,
    /// Stripes its servers owed then.
    pub missed: Vec<MissedStripes>,
}

/// An access key as `tessera key ls` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessKeyInfo {
    /// Its id.
    pub id: KeyId,
    /// The name it was created with.
    pub name: String,
}

/// Most orphans one [`ManagerResponse::Orphans`] lists.
pub const ORPHANS_LISTED_MAX: usize = 1024;

/// Why a manager request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ManagerError {
    /// No file at that path (or id).
    #[error("no such file: {0}")]
    NotFound(String),
    /// A file already exists at that path.
    #[error("file exists: {0}")]
    Exists(String),
    /// The layout asks for more servers than are up.
    #[error("width {wanted} needs {wanted} servers up, but only {up} are")]
    NotEnoughServers {
        /// Width asked for.
        wanted: u32,
        /// Servers up.
        up: u32,
    },
    /// The layout is invalid.
    #[error("{0}")]
    Layout(String),
    /// No server with that id.
    #[error("unknown server {0}")]
    UnknownServer(ServerId),
    /// The server's store belongs to another cluster than this manager's.
    #[error(
        "this manager runs cluster {ours:#x}; the server's store belongs to cluster {theirs:#x}"
    )]
    WrongCluster {
        /// This manager's cluster.
        ours: ClusterId,
        /// The cluster the server's store joined.
        theirs: ClusterId,
    },
    /// The manager's store failed.
    #[error("metadata store error: {0}")]
    Store(String),
    /// The file is not pending: its lease ran out (its writer went silent), or it was already
    /// committed or abandoned.
    #[error("file {0} is not pending: its lease ran out, or it was committed or abandoned")]
    NotPending(FileId),
    /// A size or range passes the largest file the layout can hold.
    #[error("{what} passes the maximum file size of {max} bytes")]
    TooLarge {
        /// What was asked for.
        what: String,
        /// The file's maximum size.
        max: u64,
    },
    /// The manager's store file was deleted or replaced while it ran: metadata changes are
    /// refused, because they would go to a file that is gone at the next start.
    #[error(
        "the manager's metadata store {path} was {what} while the manager ran; metadata \
         changes are refused (stop the manager and see `tessera manager recover`)"
    )]
    StoreLost {
        /// The store's file.
        path: String,
        /// What happened to it ("deleted", "replaced by another file").
        what: String,
    },
    /// The manager has no metadata store: it will not start a new, empty cluster by itself.
    #[error("{}", no_store_message(path, *cluster))]
    NoStore {
        /// Where the store should be.
        path: String,
        /// The cluster the refused server's store joined, if any.
        cluster: Option<ClusterId>,
    },
    /// The peer's role may not make this request.
    #[error("{request} needs {needs} credentials; this connection is authenticated as {role}")]
    Forbidden {
        /// The request refused.
        request: String,
        /// The roles that may make it.
        needs: String,
        /// The peer's role.
        role: Role,
    },
    /// No access key with that id.
    #[error("no access key {0}")]
    UnknownKey(KeyId),
    /// A replicated manager could not order the request now (no majority, a view change that
    /// did not end in time, or a replica still catching up): try another replica.
    #[error("the manager replica cannot order requests now: {0}")]
    Unordered(String),
    /// A retry of a request older than the client's latest one, whose answer is no longer
    /// kept.
    #[error("request {sequence} of client {client:#x} is older than its latest, {latest}")]
    Superseded {
        /// The client.
        client: u64,
        /// The request's number.
        sequence: u64,
        /// The latest number applied for the client.
        latest: u64,
    },
    /// The directory is not empty.
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// The path names a directory where a file was wanted.
    #[error("is a directory: {0}")]
    IsDir(String),
    /// A path component names a file where a directory was wanted.
    #[error("not a directory: {0}")]
    NotDir(String),
    /// A reservation that does not fit on a link (Radon's admission control).
    #[error(
        "reservation refused: {link} has {:.2} MB/s of {:.2} MB/s reservable left, {:.2} MB/s asked ({capacity})",
        *.available_bytes_per_s as f64 / 1e6,
        *.reservable_bytes_per_s as f64 / 1e6,
        *.asked_bytes_per_s as f64 / 1e6
    )]
    ReservationRefused {
        /// The link, e.g. "server 2 (10.0.0.2:7001)".
        link: String,
        /// What the stream asked of this link, bytes/s.
        asked_bytes_per_s: u64,
        /// What is left of the link's reservable share, bytes/s.
        available_bytes_per_s: u64,
        /// The link's reservable share, bytes/s.
        reservable_bytes_per_s: u64,
        /// Where the link's capacity comes from.
        capacity: String,
    },
    /// No such reservation (its lease ran out, or the manager restarted).
    #[error("no reservation {0}: it was released or its lease ran out")]
    UnknownReservation(u64),
    /// A server missed more writes of the file while it was being rebuilt: the debt changed
    /// since it was listed, and the rebuild lists it again.
    #[error("server {server} missed more writes of file {file} during its rebuild")]
    DebtChanged {
        /// The server.
        server: ServerId,
        /// The file.
        file: FileId,
    },
}

fn no_store_message(path: &str, cluster: Option<ClusterId>) -> String {
    let what = match cluster {
        Some(cluster) => format!(
            "this server holds data of cluster {cluster:#x}, whose metadata is gone with it: \
             rebuild the store from the servers with `tessera manager recover --dir DIR \
             --servers ADDR,...`"
        ),
        None => "start the manager once with --init to begin a new, empty cluster, or rebuild \
                 a lost store with `tessera manager recover`"
            .to_string(),
    };
    format!("the manager has no metadata store ({path} is missing): {what}")
}
