//! The store: files by id, their locks, the handle cache and what `sync` owes.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tessera_layout::{OverflowRole, Region};
use tessera_wire::{
    FileId, FileMeta, IndexRange, KeptAction, OverflowExtent, ParityIntent, StorageError,
};

use crate::boot::{self, UnsyncedMark};
use crate::disk::{Disk, DiskLock, EntryKind, FileHandle, RealDisk};
use crate::intent::{IntentRecord, Intents, INTENTS_DIR};
use crate::io::{bad_request, check_range, data_ranges, disk, disk_format};
use crate::kept;
use crate::meta::{self, StoreMeta};
use crate::overflow::{OverflowFiles, Touched};
use crate::record::{self, FileRecord, RecordError, RecordPage};
use crate::region::{CutMark, RegionFile, CRC_ENTRY_BYTES};
use crate::roster::ROSTER_NAME;
use crate::seal::SealDue;
use crate::snapshot::{Snapshots, Written, JOURNAL_NAME};
use crate::stale::{StaleRecords, StaleState, STALE_DIR};
use crate::tombstone::Tombstones;
use crate::{BLOCK_BYTES, FILE_BYTES_MAX, OPEN_FILES_MAX, REQUEST_BYTES_MAX};

/// Directory under the root holding one directory per file id.
const FILES_DIR: &str = "files";
/// Lock file under the root, held exclusively while a store is open.
const LOCK_FILE: &str = "store.lock";

/// The six files kept for each file id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FileKind {
    Data,
    DataCrc,
    Redundancy,
    RedundancyCrc,
    Overflow,
    OverflowLog,
}

impl FileKind {
    const ALL: [FileKind; 6] = [
        FileKind::Data,
        FileKind::DataCrc,
        FileKind::Redundancy,
        FileKind::RedundancyCrc,
        FileKind::Overflow,
        FileKind::OverflowLog,
    ];

    fn name(self) -> &'static str {
        match self {
            FileKind::Data => "data",
            FileKind::DataCrc => "data.crc",
            FileKind::Redundancy => "redundancy",
            FileKind::RedundancyCrc => "redundancy.crc",
            FileKind::Overflow => "overflow",
            FileKind::OverflowLog => "overflow.log",
        }
    }

    /// The block file and checksum sidecar of a region.
    fn of_region(region: Region) -> [FileKind; 2] {
        match region {
            Region::Data => [FileKind::Data, FileKind::DataCrc],
            Region::Redundancy => [FileKind::Redundancy, FileKind::RedundancyCrc],
        }
    }
}

/// Everything open for one file id whose directory exists.
struct FileData {
    data: RegionFile,
    redundancy: RegionFile,
    overflow: OverflowFiles,
    /// Copy-on-write snapshots of the file (see `snapshot.rs`).
    snap: Snapshots,
}

impl FileData {
    fn region(&self, region: Region) -> &RegionFile {
        match region {
            Region::Data => &self.data,
            Region::Redundancy => &self.redundancy,
        }
    }

    fn region_mut(&mut self, region: Region) -> &mut RegionFile {
        match region {
            Region::Data => &mut self.data,
            Region::Redundancy => &mut self.redundancy,
        }
    }

    /// Before `offset..offset+len` of `region` changes (for the data file, its newest bytes,
    /// overflow included): copies what the newest snapshot still needs of it.
    fn preserve(
        &mut self,
        region: Region,
        offset: u64,
        len: u64,
    ) -> Result<Vec<Written>, StorageError> {
        let FileData {
            data,
            redundancy,
            overflow,
            snap,
        } = self;
        if snap.begun() == 0 {
            return Ok(Vec::new());
        }
        let live = |at: u64, len: usize| newest(data, redundancy, overflow, region, at, len);
        snap.preserve(region, offset, len, &live)
    }

    /// Begins snapshot `epoch` of the file, its parity in the redundancy-file spans `torn`
    /// copied and recorded torn (see `snapshot.rs`).
    fn begin_snapshot(
        &mut self,
        epoch: u64,
        torn: &[(u64, u64)],
    ) -> Result<Vec<Written>, StorageError> {
        let FileData {
            data,
            redundancy,
            overflow,
            snap,
        } = self;
        let region = Region::Redundancy;
        let live = |at: u64, len: usize| newest(data, redundancy, overflow, region, at, len);
        snap.begin(epoch, torn, &live)
    }

    fn handle(&self, kind: FileKind) -> &FileHandle {
        match kind {
            FileKind::Data => &self.data.bytes,
            FileKind::DataCrc => &self.data.crc,
            FileKind::Redundancy => &self.redundancy.bytes,
            FileKind::RedundancyCrc => &self.redundancy.crc,
            FileKind::Overflow => &self.overflow.bytes,
            FileKind::OverflowLog => &self.overflow.log,
        }
    }
}

/// What is known of one file id.
enum FileState {
    /// Not looked at on disk yet (or forgotten after a panic while it was locked).
    Unloaded,
    /// No directory: nothing was ever written, or it was removed. Reads see zeros.
    Absent,
    /// Directory and files open.
    Present(Box<FileData>),
}

/// One file id's state behind its lock: reads share it, writes and overflow changes own it.
struct FileSlot {
    state: RwLock<FileState>,
}

/// The newest bytes of a region: the data file overlaid with primary overflow entries, or
/// the redundancy file.
fn newest(
    data: &RegionFile,
    redundancy: &RegionFile,
    overflow: &OverflowFiles,
    region: Region,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, StorageError> {
    match region {
        Region::Data => {
            let mut bytes = data.read(offset, len)?;
            overflow.overlay(offset, &mut bytes)?;
            Ok(bytes)
        }
        Region::Redundancy => redundancy.read(offset, len),
    }
}

/// Files and directories written since the last sync.
#[derive(Default)]
struct Dirty {
    files: HashMap<(FileId, FileKind), FileHandle>,
    /// Seals of overflow logs (`false`) and snapshot journals (`true`), taken when the sync
    /// starts and written once the logs are durable (never owed past it: the next sync of a
    /// log that failed takes its seal again).
    seals: HashMap<(FileId, bool), SealDue>,
    /// Snapshot journals and copy files, by file and name.
    snapshot_files: HashMap<(FileId, String), FileHandle>,
    /// Intent records written since and not deleted, by path (taken from
    /// `Intents::unsynced` by a sync).
    intent_records: HashMap<PathBuf, FileHandle>,
    /// Stale-parity records written since and not deleted, by path (from
    /// `StaleRecords::unsynced`).
    stale_records: HashMap<PathBuf, FileHandle>,
    dirs: HashSet<PathBuf>,
}

/// One storage server's on-disk store. See the crate doc for the format.
///
/// All methods do blocking I/O; call them from `spawn_blocking` in async code. The store is
/// `Send + Sync`: operations on different files run in parallel, reads of one file share its
/// lock, and writes and overflow changes of one file take it exclusively, so a read never sees
/// new bytes with an old checksum.
/// What [`Store::disk_usage`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// The file system's size in bytes.
    pub total: u64,
    /// Bytes still free for the store.
    pub available: u64,
    /// Bytes the store's files occupy (allocated blocks, metadata included).
    pub stored: u64,
}

pub struct Store {
    /// The disk everything is on: the real one, or an in-memory one in simulations.
    disk: Arc<dyn Disk>,
    root: PathBuf,
    files_dir: PathBuf,
    incarnation: u64,
    /// Held so that `set_server_id` writes `store.toml` one at a time.
    meta: Mutex<StoreMeta>,
    /// Files recently used, with their state; idle ones are dropped past [`OPEN_FILES_MAX`].
    slots: Mutex<HashMap<FileId, Arc<FileSlot>>>,
    dirty: Mutex<Dirty>,
    /// Serializes `sync` calls, so that one returns only after everything written before it
    /// is durable, even if another sync took those files from the dirty set first.
    sync_lock: Mutex<()>,
    /// Unresolved intent records of read-modify-writes (see `intent.rs`).
    intents: Mutex<Intents>,
    /// Stale-parity records of full-stripe writes (see `stale.rs`).
    stale: Mutex<StaleRecords>,
    /// Present on disk while an answered write is not synced (see `boot.rs`).
    unsynced: UnsyncedMark,
    /// Ids of files the manager removed: never made again here (see `tombstone.rs`).
    tombstones: Mutex<Tombstones>,
    /// Keeps the exclusive lock on `store.lock` for the store's lifetime.
    _lock: DiskLock,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.root)
            .field("incarnation", &format_args!("{:016x}", self.incarnation))
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store at `root`, creating it (with a new random incarnation) if `root` has no
    /// `store.toml`. A directory without `store.toml` is a wiped store: any file directories
    /// left in it are deleted, since the new incarnation declares that nothing is held.
    /// Fails if another `Store` (in any process) has the directory open.
    pub fn open(root: &Path) -> Result<Store, StorageError> {
        Store::open_on(RealDisk::shared(), root)
    }

    /// [`open`](Self::open) on `disk` (an in-memory disk in simulations).
    pub fn open_on(disk: Arc<dyn Disk>, root: &Path) -> Result<Store, StorageError> {
        create_root(&*disk, root)?;
        let lock = lock_root(&*disk, root)?;
        // What a process that died before us wrote may still be only in the page cache, and
        // our `sync` will not know of it: make it durable before trusting it (a write the
        // old process answered and our sync then acknowledged would otherwise be lost to a
        // power loss).
        disk.sync_fs(root)
            .map_err(|error| self::disk(format_args!("sync {}", root.display()), error))?;
        let files_dir = root.join(FILES_DIR);
        let meta = load_or_create_meta(&*disk, root, &files_dir)?;
        let meta = renew_if_writes_lost(&*disk, root, &files_dir, meta)?;
        let (mut intents, damaged) = Intents::open(&disk, root)?;
        let mut stale = StaleRecords::open(&disk, root)?;
        keep_damaged_intents_as_stale(&*disk, &mut intents, &mut stale, &damaged)?;
        let tombstones = Tombstones::open(&disk, root)?;
        Ok(Store {
            tombstones: Mutex::new(tombstones),
            unsynced: UnsyncedMark::new(root),
            disk,
            intents: Mutex::new(intents),
            stale: Mutex::new(stale),
            root: root.to_path_buf(),
            files_dir,
            incarnation: meta.incarnation,
            meta: Mutex::new(meta),
            slots: Mutex::new(HashMap::new()),
            dirty: Mutex::new(Dirty::default()),
            sync_lock: Mutex::new(()),
            _lock: lock,
        })
    }

    /// Random id of this store, drawn when it was created; a wiped store has a new one.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The server id persisted with [`Store::set_membership`], if any.
    pub fn server_id(&self) -> Option<u32> {
        lock(&self.meta).server_id
    }

    /// The cluster persisted with [`Store::set_membership`], if any.
    pub fn cluster_id(&self) -> Option<u64> {
        lock(&self.meta).cluster_id
    }

    /// Persists the cluster this server joined and the id its manager assigned (durably,
    /// before returning).
    pub fn set_membership(&self, cluster: u64, server: u32) -> Result<(), StorageError> {
        let mut meta = lock(&self.meta);
        let updated = StoreMeta {
            server_id: Some(server),
            cluster_id: Some(cluster),
            ..*meta
        };
        meta::save(&*self.disk, &self.root, &updated)?;
        *meta = updated;
        Ok(())
    }

    /// Reads `len` bytes at `offset` of a file's data or redundancy file, verifying the
    /// checksum of every block touched. Bytes never written read as zeros. With `overlay`
    /// (data only), live primary overflow entries are laid over the data file's bytes,
    /// so the newest bytes are returned.
    pub fn read(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        len: u32,
        overlay: bool,
    ) -> Result<Vec<u8>, StorageError> {
        check_read(region, offset, len, overlay)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.with_read(file, |state| match state {
            FileState::Present(data) => {
                let mut bytes = data.region(region).read(offset, len as usize)?;
                if overlay {
                    data.overflow.overlay(offset, &mut bytes)?;
                }
                Ok(bytes)
            }
            _ => Ok(vec![0; len as usize]),
        })
    }

    /// [`read`](Self::read) without waiting: `Ok(None)` where the answer needs the disk (the
    /// blocks or checksums are not in the page cache, the file is not loaded, overflow entries
    /// overlay the range) or another operation holds the file. A server answers what this
    /// returns on its network thread, with no hand-off to the blocking pool and back.
    pub fn read_cached(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        len: u32,
        overlay: bool,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        check_read(region, offset, len, overlay)?;
        let slot = self.slot(file);
        let Ok(state) = slot.state.try_read() else {
            return Ok(None);
        };
        match &*state {
            FileState::Unloaded => Ok(None),
            FileState::Present(data) => {
                if overlay && data.overflow.overlays(offset, u64::from(len)) {
                    return Ok(None);
                }
                data.region(region).read_cached(offset, len as usize)
            }
            _ => Ok(Some(vec![0; len as usize])),
        }
    }

    /// Writes `data` at `offset` of a file's data or redundancy file, in whole 4 KiB blocks.
    /// A partly covered edge block that fails its checksum fails the write with
    /// [`StorageError::Corrupt`] before anything changes. With `invalidate_overflow` (data
    /// only), primary overflow entries under the written bytes are trimmed in the same step.
    pub fn write(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        data: &[u8],
        invalidate_overflow: bool,
    ) -> Result<(), StorageError> {
        check_range(offset, data.len() as u64, u64::from(REQUEST_BYTES_MAX))?;
        if invalidate_overflow && region == Region::Redundancy {
            return Err(bad_request(
                "overflow entries are addressed by data offsets; a redundancy write cannot \
                 invalidate them",
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        self.with_write(file, |state| {
            let present = self.make_present(file, state)?;
            let copied = present.preserve(region, offset, data.len() as u64)?;
            self.mark_snapshot_dirty(file, copied);
            present.region_mut(region).write(offset, data)?;
            self.mark_dirty(file, present, &FileKind::of_region(region));
            if invalidate_overflow && present.overflow.overlays(offset, data.len() as u64) {
                // The trim must not reach the disk before the bytes that replace what it
                // trims: a power loss would uncover the older bytes beneath the entries.
                present.data.sync()?;
            }
            if invalidate_overflow {
                let touched = present.overflow.invalidate(
                    OverflowRole::Primary,
                    offset,
                    data.len() as u64,
                )?;
                self.mark_overflow_dirty(file, present, touched);
            }
            Ok(())
        })?;
        if region == Region::Redundancy {
            // Parity written over a whole span was computed from the data (full-stripe write,
            // rebuilt unit): the span's record describes nothing left to resolve.
            let mut intents = lock(&self.intents);
            if intents.clear_covered(file, offset, data.len() as u64)? {
                lock(&self.dirty).dirs.insert(intents.dir().to_path_buf());
            }
        }
        Ok(())
    }

    /// [`Store::write`] of whole blocks if it needs nothing but the page cache and no lock
    /// that is held ([`Store::with_cached`]), and no overflow entry lies under the bytes
    /// (trimming one syncs first) and, for parity, no intent record of the file is held (a
    /// parity write may resolve one). `Ok(None)`: nothing was done, [`Store::write`] does
    /// it. Lets a network thread answer a write without handing it to another thread; the
    /// page-cache write itself may still wait on the kernel's dirty-page throttling, which
    /// the caller watches for.
    pub fn write_cached(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        data: &[u8],
        invalidate_overflow: bool,
    ) -> Result<Option<()>, StorageError> {
        check_range(offset, data.len() as u64, u64::from(REQUEST_BYTES_MAX))?;
        let len = data.len() as u64;
        let whole_blocks = offset.is_multiple_of(BLOCK_BYTES) && len.is_multiple_of(BLOCK_BYTES);
        if data.is_empty() || !whole_blocks || (invalidate_overflow && region == Region::Redundancy)
        {
            return Ok(None);
        }
        // A parity write may resolve an intent record (see `write`); held through the write,
        // so that a record made meanwhile cannot miss its clearing. Data writes touch none.
        let _intents = match region {
            Region::Redundancy => match self.intents.try_lock() {
                Ok(intents) if !intents.has_records(file) => Some(intents),
                _ => return Ok(None),
            },
            Region::Data => None,
        };
        self.with_cached(file, |present| {
            if invalidate_overflow && present.overflow.overlays(offset, len) {
                return Ok(None);
            }
            present.region_mut(region).write(offset, data)?;
            self.mark_dirty(file, present, &FileKind::of_region(region));
            Ok(Some(()))
        })
    }

    /// [`Store::overflow_write`] if it needs nothing but the page cache and no lock that is
    /// held ([`Store::with_cached`]); `Ok(None)`: nothing was done.
    pub fn overflow_write_cached(
        &self,
        file: FileId,
        role: OverflowRole,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<()>, StorageError> {
        check_range(offset, data.len() as u64, u64::from(REQUEST_BYTES_MAX))?;
        if data.is_empty() {
            return Ok(None);
        }
        self.with_cached(file, |present| {
            present.overflow.append(role, offset, data)?;
            let touched = Touched {
                bytes: true,
                log: true,
            };
            self.mark_overflow_dirty(file, present, touched);
            Ok(Some(()))
        })
    }

    /// Runs `op` on an open file if that waits for nothing: the `unsynced` mark durable
    /// already (making it syncs a directory; it is held through `op`), the file open and its
    /// lock free, and no snapshot begun (blocks are copied before they are overwritten).
    /// `Ok(None)` otherwise.
    fn with_cached(
        &self,
        file: FileId,
        op: impl FnOnce(&mut FileData) -> Result<Option<()>, StorageError>,
    ) -> Result<Option<()>, StorageError> {
        let Some(_unsynced) = self.unsynced.try_hold() else {
            return Ok(None);
        };
        let slot = self.slot(file);
        let Ok(mut state) = slot.state.try_write() else {
            return Ok(None);
        };
        match &mut *state {
            FileState::Present(present) if present.snap.begun() == 0 => op(present),
            _ => Ok(None),
        }
    }

    /// Records what a read-modify-write of `stripe` of `file` is about to change:
    /// `intent`, the span's current parity (read here) and the pieces' old data. Answered
    /// only once the record is written; the writer writes no data before that. Refused if
    /// the stripe has an unresolved record. See `intent.rs`.
    ///
    /// The record is not synced before the answer, as an answered write is not: the
    /// `unsynced` mark is held (made durable first if it was not), so a power loss before
    /// the next sync renews the whole store (`boot.rs`), records and all, and the next sync
    /// makes the record and its directory durable before the mark may go. (Synced here, it
    /// cost every read-modify-write an `fdatasync` and a directory sync at the parity
    /// server.)
    pub fn record_intent(
        &self,
        file: FileId,
        stripe: u64,
        intent: &ParityIntent,
        old_data: &[u8],
    ) -> Result<(), StorageError> {
        let offset = intent
            .unit_offset
            .checked_add(u64::from(intent.span_start))
            .ok_or_else(|| bad_request("intent span past the end of any file"))?;
        if intent.span_len > REQUEST_BYTES_MAX {
            return Err(bad_request("intent span longer than one request"));
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        let old_parity = self.read(file, Region::Redundancy, offset, intent.span_len, false)?;
        let mut intents = lock(&self.intents);
        intents.record(file, stripe, intent, &old_parity, old_data)?;
        lock(&self.dirty).dirs.insert(intents.dir().to_path_buf());
        Ok(())
    }

    /// The unresolved intent record of `stripe` of `file`, with its old parity then old data.
    pub fn intent(&self, file: FileId, stripe: u64) -> Result<Option<IntentRecord>, StorageError> {
        lock(&self.intents).get(file, stripe)
    }

    /// Deletes the intent record of `stripe` of `file` (its parity was written by the lock's
    /// holder). The deletion becomes durable at the next [`sync`](Self::sync).
    pub fn clear_intent(&self, file: FileId, stripe: u64) -> Result<(), StorageError> {
        let mut intents = lock(&self.intents);
        if intents.clear(file, stripe)? {
            lock(&self.dirty).dirs.insert(intents.dir().to_path_buf());
        }
        Ok(())
    }

    /// Records that parity of `stripes` of `file` may not match the data (a full-stripe
    /// write is about to start), leased until `lease_end`; returns the record's token.
    /// Answered once the record is written, not synced, as [`Store::record_intent`] (see
    /// there): under the durable `unsynced` mark, durable at the next sync. See `stale.rs`.
    pub fn record_stale(
        &self,
        file: FileId,
        stripes: IndexRange,
        lease_end: tokio::time::Instant,
    ) -> Result<u64, StorageError> {
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        let mut stale = lock(&self.stale);
        let token = stale.record(file, stripes, lease_end)?;
        lock(&self.dirty).dirs.insert(stale.dir().to_path_buf());
        Ok(token)
    }

    /// Extends the lease of stale-parity record `token` to `lease_end`.
    pub fn renew_stale(
        &self,
        file: FileId,
        token: u64,
        lease_end: tokio::time::Instant,
    ) -> Result<(), StorageError> {
        lock(&self.stale).renew(file, token, lease_end)
    }

    /// Deletes stale-parity record `token` (its writer finished) and takes `stripes` out of
    /// the records of `file` orphaned by `now` (their parity was computed from the data).
    /// The deletion becomes durable at the next [`sync`](Self::sync).
    pub fn clear_stale(
        &self,
        file: FileId,
        token: Option<u64>,
        stripes: IndexRange,
        now: tokio::time::Instant,
    ) -> Result<(), StorageError> {
        let mut stale = lock(&self.stale);
        if stale.clear(file, token, stripes, now)? {
            lock(&self.dirty).dirs.insert(stale.dir().to_path_buf());
        }
        Ok(())
    }

    /// Whether parity of `stripe` of `file` is under a stale-parity record at `now`.
    pub fn stale_state(&self, file: FileId, stripe: u64, now: tokio::time::Instant) -> StaleState {
        lock(&self.stale).state(file, stripe, now)
    }

    /// The ranges of stripes under stale-parity records orphaned at `now` (their writer
    /// stopped renewing them), at most `max` of them.
    pub fn orphaned_stale(
        &self,
        now: tokio::time::Instant,
        max: usize,
    ) -> Vec<(FileId, tessera_wire::IndexRange)> {
        lock(&self.stale).orphaned(now, max)
    }

    /// Whether `file` has a stale-parity record here, live or orphaned.
    pub fn has_stale_records(&self, file: FileId) -> bool {
        lock(&self.stale).has_file(file)
    }

    /// Number of stale-parity records kept.
    pub fn stale_records(&self) -> usize {
        lock(&self.stale).len()
    }

    /// Appends an overflow entry of `role` covering `offset..offset+data.len()` of the
    /// primary column's data file. It shadows older entries of the same role there.
    pub fn overflow_write(
        &self,
        file: FileId,
        role: OverflowRole,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        check_range(offset, data.len() as u64, u64::from(REQUEST_BYTES_MAX))?;
        if data.is_empty() {
            return Ok(());
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        self.with_write(file, |state| {
            let present = self.make_present(file, state)?;
            if role == OverflowRole::Primary {
                let copied = present.preserve(Region::Data, offset, data.len() as u64)?;
                self.mark_snapshot_dirty(file, copied);
            }
            present.overflow.append(role, offset, data)?;
            self.mark_overflow_dirty(
                file,
                present,
                Touched {
                    bytes: true,
                    log: true,
                },
            );
            Ok(())
        })
    }

    /// Trims overflow entries of `role` away from `offset..offset+len`: an entry partly inside
    /// keeps only its parts outside.
    pub fn overflow_invalidate(
        &self,
        file: FileId,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        check_range(offset, len, FILE_BYTES_MAX)?;
        if len == 0 {
            return Ok(());
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        self.with_write(file, |state| {
            if let FileState::Present(present) = state {
                if role == OverflowRole::Primary && present.overflow.overlays(offset, len) {
                    let copied = present.preserve(Region::Data, offset, len)?;
                    self.mark_snapshot_dirty(file, copied);
                }
                let touched = present.overflow.invalidate(role, offset, len)?;
                self.mark_overflow_dirty(file, present, touched);
            }
            Ok(())
        })
    }

    /// Repairs the bad parts of `role`'s overflow entries of `file` in `offset..offset+len`
    /// (those a damaged log record may have changed, and entries whose bytes fail their
    /// checksum) from the other copy's entries there, `entries` with their bytes back to back
    /// in `bytes`; every part that verifies stays as it is (see `Overflow::repair_damaged`). Checked against each
    /// other: the entries lie inside the range, do not overlap, and their lengths sum to
    /// `bytes`.
    pub fn overflow_repair_damaged(
        &self,
        file: FileId,
        role: OverflowRole,
        offset: u64,
        len: u64,
        entries: &[tessera_wire::OverflowExtent],
        bytes: &[u8],
    ) -> Result<(), StorageError> {
        check_range(offset, len, FILE_BYTES_MAX)?;
        check_repair_entries(offset, len, entries, bytes)?;
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        self.with_write(file, |state| {
            let present = self.make_present(file, state)?;
            if role == OverflowRole::Primary && present.overflow.overlays(offset, len) {
                let copied = present.preserve(Region::Data, offset, len)?;
                self.mark_snapshot_dirty(file, copied);
            }
            let touched = present
                .overflow
                .repair_damaged(role, offset, len, entries, bytes)?;
            self.mark_overflow_dirty(file, present, touched);
            Ok(())
        })
    }

    /// Discards everything `region` of `file` holds from `from` (a multiple of 4 KiB) on,
    /// and for the data file the primary overflow entries from there on: it all reads as
    /// zeros after (a truncation, without writing zeros). Blocks the newest snapshot of the
    /// file still needs are copied first. Refused with [`StorageError::WritesInFlight`]
    /// while an intent record of the file is unresolved here: its resolution reads the bytes
    /// this would discard (the caller writes zeros instead, under the stripes' locks). The
    /// caller fences the file's writes (the server checks), which drains the stale-parity
    /// records of others; its own, taken for the discard, are what make a caller's death
    /// part-way safe (`tessera-client`'s `truncate` module).
    pub fn discard(&self, file: FileId, region: Region, from: u64) -> Result<(), StorageError> {
        if !from.is_multiple_of(BLOCK_BYTES) || from > FILE_BYTES_MAX {
            return Err(bad_request(format!(
                "discard from {from}: not a multiple of {BLOCK_BYTES} at most {FILE_BYTES_MAX}"
            )));
        }
        if !lock(&self.intents).spans_of(file).is_empty() {
            return Err(StorageError::WritesInFlight { file });
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        self.with_write(file, |state| {
            let FileState::Present(present) = state else {
                return Ok(());
            };
            let mut end = present.region(region).len()?;
            if region == Region::Data {
                let entries = present.overflow.covered(from, FILE_BYTES_MAX - from);
                end = entries.iter().map(|&(_, stop)| stop).fold(end, u64::max);
            }
            if end > from {
                let copied = present.preserve(region, from, end - from)?;
                self.mark_snapshot_dirty(file, copied);
            }
            // A discard that cuts nothing writes no mark.
            let mark = CutMark::new(&self.file_dir(file), region);
            let region_file = present.region_mut(region);
            if region_file.discard_from(from, || mark.set(&*self.disk, from))? {
                mark.clear(&*self.disk)?;
                self.mark_dirty(file, present, &FileKind::of_region(region));
            }
            if region == Region::Data {
                let touched = present.overflow.invalidate(
                    OverflowRole::Primary,
                    from,
                    FILE_BYTES_MAX - from,
                )?;
                self.mark_overflow_dirty(file, present, touched);
            }
            Ok(())
        })
    }

    /// Live overflow entries of `role` overlapping `offset..offset+len`, clipped to it,
    /// oldest first, with their bytes concatenated in the same order. Entries of one role
    /// never overlap each other. Fails with [`StorageError::BadRequest`] if the answer would
    /// not fit in one message ([`crate::REQUEST_BYTES_MAX`] bytes,
    /// [`crate::LIST_EXTENTS_MAX`] extents).
    pub fn overflow_list(
        &self,
        file: FileId,
        role: OverflowRole,
        offset: u64,
        len: u64,
    ) -> Result<(Vec<OverflowExtent>, Vec<u8>), StorageError> {
        check_range(offset, len, FILE_BYTES_MAX)?;
        if len == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        self.with_read(file, |state| match state {
            FileState::Present(present) => present.overflow.list(role, offset, len),
            _ => Ok((Vec::new(), Vec::new())),
        })
    }

    /// Bytes stored for a file: 4 KiB per written block of the data and redundancy files,
    /// plus the live overflow bytes of both roles.
    pub fn usage(&self, file: FileId) -> Result<u64, StorageError> {
        self.with_read(file, |state| match state {
            FileState::Present(present) => Ok(BLOCK_BYTES
                * (present.data.blocks_written() + present.redundancy.blocks_written())
                + present.overflow.live_bytes()),
            _ => Ok(0),
        })
    }

    /// The file system's size and free space, and the bytes this store's files occupy on
    /// it (a walk of the whole directory: callers cache it).
    pub fn disk_usage(&self) -> Result<DiskUsage, StorageError> {
        let space = (self.disk.space(&self.root))
            .map_err(|error| disk(format_args!("statvfs {}", self.root.display()), error))?;
        let mut stored = 0u64;
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            let names = match self.disk.read_dir(&dir) {
                Ok(names) => names,
                // Removed while we walked (a file deleted): nothing to count.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(disk(format_args!("list {}", dir.display()), error)),
            };
            for name in names {
                let path = dir.join(name);
                match self.disk.kind(&path) {
                    Ok(Some(EntryKind::Dir)) => dirs.push(path),
                    Ok(Some(EntryKind::File)) => {
                        stored = stored.saturating_add(self.disk.allocated(&path).unwrap_or(0))
                    }
                    Ok(None) | Err(_) => {}
                }
            }
        }
        Ok(DiskUsage {
            total: space.total,
            available: space.available,
            stored,
        })
    }

    /// Begins snapshot `epoch` of `files` here (see `snapshot.rs`): from now on the first
    /// write to each block copies it first. Durable before returning (the store is synced
    /// once, so the files' directories and journals are named durably too).
    pub fn snapshot_begin(&self, files: &[FileId], epoch: u64) -> Result<(), StorageError> {
        if epoch == 0 {
            return Err(bad_request("snapshot epochs start at 1"));
        }
        let _unsynced = self.unsynced.hold(&*self.disk)?;
        for &file in files {
            let dir = self.file_dir(file);
            // Parity under an intent record here matches neither the old nor the new data
            // (its writer died mid-write; the locks were drained before a fenced begin).
            let torn = lock(&self.intents).spans_of(file);
            self.with_write(file, |state| {
                let present = self.make_present(file, state)?;
                let written = present.begin_snapshot(epoch, &torn)?;
                if !written.is_empty() {
                    self.mark_snapshot_dirty(file, written);
                    lock(&self.dirty).dirs.insert(dir.clone());
                }
                Ok(())
            })?;
        }
        self.sync()
    }

    /// `len` bytes at `offset` of a file's data (newest bytes, overflow overlaid) or
    /// redundancy file as they stood when snapshot `epoch` began here. A block this server
    /// cannot give for that snapshot is [`StorageError::Corrupt`].
    pub fn read_snapshot(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        len: u32,
        epoch: u64,
    ) -> Result<Vec<u8>, StorageError> {
        check_range(offset, u64::from(len), u64::from(REQUEST_BYTES_MAX))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.with_write(file, |state| match state {
            FileState::Present(present) => {
                let FileData {
                    data,
                    redundancy,
                    overflow,
                    snap,
                } = &mut **present;
                let live =
                    |at: u64, len: usize| newest(data, redundancy, overflow, region, at, len);
                snap.read(region, offset, len as usize, epoch, &live)
            }
            _ => Err(StorageError::Corrupt {
                file,
                region,
                offset,
            }),
        })
    }

    /// Snapshot `epoch` of `file` was removed, and `live` are its snapshots still kept:
    /// deletes the copies none of them reads.
    pub fn snapshot_drop(
        &self,
        file: FileId,
        epoch: u64,
        live: &[u64],
    ) -> Result<(), StorageError> {
        self.with_write(file, |state| match state {
            FileState::Present(present) => present.snap.drop_snapshot(epoch, live).map(|_| ()),
            _ => Ok(()),
        })
    }

    /// Bytes of copies kept for snapshots of `file`.
    pub fn snapshot_usage(&self, file: FileId) -> Result<u64, StorageError> {
        self.with_read(file, |state| match state {
            FileState::Present(present) => Ok(present.snap.copied_bytes()),
            _ => Ok(0),
        })
    }

    /// Byte ranges of `offset..offset+len` of a file's data or redundancy file that may hold
    /// written bytes: its file system extents, and for the data file also every live overflow
    /// entry of either role. Sorted, disjoint, at most [`tessera_wire::ALLOCATED_RANGES_MAX`]
    /// (past that the last range runs to the end: a superset, never a subset). Everything
    /// outside reads as zeros, so scrub and rebuild need not visit it.
    pub fn allocated(
        &self,
        file: FileId,
        region: Region,
        offset: u64,
        len: u64,
    ) -> Result<Vec<IndexRange>, StorageError> {
        check_range(offset, len, FILE_BYTES_MAX)?;
        let end = offset + len;
        let ranges_max = tessera_wire::ALLOCATED_RANGES_MAX;
        let mut ranges = self.with_read(file, |state| match state {
            FileState::Present(present) => {
                let extents = |handle: &FileHandle, from: u64, to: u64| {
                    data_ranges(&**handle, from, to, ranges_max)
                        .map_err(|error| disk(format_args!("extents of file {file}"), error))
                };
                let files = present.region(region);
                let mut ranges = extents(&files.bytes, offset, end)?;
                // Blocks whose checksum entries are on disk too, though their bytes are a hole:
                // a damaged entry there must be found by a scrub.
                let entries_per_block = BLOCK_BYTES / CRC_ENTRY_BYTES;
                let (crc_first, crc_end) = (offset / entries_per_block, end / entries_per_block);
                for (start, stop) in extents(&files.crc, crc_first, crc_end + CRC_ENTRY_BYTES)? {
                    let blocks = start / CRC_ENTRY_BYTES..stop.div_ceil(CRC_ENTRY_BYTES);
                    ranges.push((blocks.start * BLOCK_BYTES, blocks.end * BLOCK_BYTES));
                }
                if region == Region::Data {
                    ranges.extend(present.overflow.covered(offset, len));
                }
                Ok(ranges)
            }
            _ => Ok(Vec::new()),
        })?;
        ranges.sort_unstable();
        let mut merged: Vec<IndexRange> = Vec::new();
        for (start, stop) in ranges {
            let (start, stop) = (start.max(offset), stop.min(end));
            if start >= stop {
                continue;
            }
            let full = merged.len() == ranges_max;
            if let Some(last) = merged.last_mut() {
                if start <= last.end || full {
                    last.end = if full { end } else { last.end.max(stop) };
                    continue;
                }
            }
            merged.push(IndexRange::new(start, stop));
        }
        Ok(merged)
    }

    /// Makes everything written before this call durable: `fdatasync` of every file written
    /// since the last sync and of every directory created or changed since; then removes
    /// the `unsynced` mark if nothing is owed ([`Store::sync_keeping_mark`] followed by
    /// [`Store::clear_unsynced_mark`]).
    pub fn sync(&self) -> Result<(), StorageError> {
        self.sync_keeping_mark()?;
        self.clear_unsynced_mark()
    }

    /// [`Store::sync`] without removing the `unsynced` mark, so that a server can answer the
    /// sync before the mark's removal (an unlink and a root directory sync) and call
    /// [`Store::clear_unsynced_mark`] after. Everything written before the call is durable
    /// when it returns: that is all the answer promises. A mark left behind a little longer
    /// only means that a power loss in between makes the store take a new incarnation
    /// needlessly (a rebuild from the others); a mark missing while a write is owed would be
    /// the unsafe way, and the removal checks for that under the sync lock (see there).
    pub fn sync_keeping_mark(&self) -> Result<(), StorageError> {
        let _one_at_a_time = lock(&self.sync_lock);
        let owed = self.take_owed()?;
        let result = sync_owed(&*self.disk, &owed);
        if result.is_err() {
            self.owe_again(owed);
        }
        result
    }

    /// The first steps of a sync, under its lock: the rosters synced, then everything owed
    /// taken from the dirty set with the seals of its overflow logs and journals added (the
    /// seals take each file's lock in turn, so before a caller takes one). A failed seal
    /// leaves it all owed.
    fn take_owed(&self) -> Result<Dirty, StorageError> {
        // The rosters before the directories: a record deleted durably while its roster
        // still names it would be taken as lost at the next open (a needless resolution).
        let intent_records = {
            let mut intents = lock(&self.intents);
            intents.sync_roster()?;
            intents.unsynced.take()
        };
        let stale_records = {
            let mut stale = lock(&self.stale);
            stale.sync_roster().map(|()| stale.unsynced.take())
        };
        let stale_records = match stale_records {
            Ok(records) => records,
            Err(error) => {
                lock(&self.intents).unsynced.owe_again(intent_records);
                return Err(error);
            }
        };
        let mut owed = std::mem::take(&mut *lock(&self.dirty));
        owed.intent_records = intent_records;
        owed.stale_records = stale_records;
        if let Err(error) = self.seal_logs(&mut owed) {
            self.owe_again(owed);
            return Err(error);
        }
        Ok(owed)
    }

    /// Puts back what a failed sync took from the dirty set, so the next sync tries again.
    fn owe_again(&self, owed: Dirty) {
        let mut dirty = lock(&self.dirty);
        for (key, handle) in owed.files {
            dirty.files.entry(key).or_insert(handle);
        }
        for (key, handle) in owed.snapshot_files {
            dirty.snapshot_files.entry(key).or_insert(handle);
        }
        dirty.dirs.extend(owed.dirs);
        drop(dirty);
        lock(&self.intents).unsynced.owe_again(owed.intent_records);
        lock(&self.stale).unsynced.owe_again(owed.stale_records);
    }

    /// [`Store::describe`] and [`Store::sync_keeping_mark`] in one batch of syncs: writes
    /// the record's new bytes (`record.new`), makes them durable together with every file
    /// the sync owes (their `fdatasync`s issued at once, [`sync_at_once`]), renames the
    /// record into place, then syncs each directory owed once
    /// (the file's directory, which names the record and the file's files, then `files/`
    /// and the others). Where the two calls sync the file's directory (or `files/`) twice
    /// and run their file syncs one call after the other, this syncs them once.
    ///
    /// The crash order is the two calls' own: the rosters before any directory (see
    /// [`Store::sync_keeping_mark`]); the record's bytes durable before its rename is (the
    /// rename is made durable only by the directory sync that follows the file syncs); every
    /// answered write durable before the call returns. A power loss at any step leaves the
    /// old record or the new one, whole. The file's lock is held from the record's write to
    /// its directory's sync, so no other record replaces `record.new` in between and no
    /// entry is made in the directory after its sync and before it leaves the owed set.
    pub fn describe_and_sync(&self, meta: &FileMeta, committed: bool) -> Result<(), StorageError> {
        let _one_at_a_time = lock(&self.sync_lock);
        let mut owed = self.take_owed()?;
        let dir = self.file_dir(meta.id);
        let result = self.with_write(meta.id, |state| {
            self.make_present(meta.id, state)?;
            {
                // A directory made just now is owed by this sync too.
                let mut dirty = lock(&self.dirty);
                for made in [&dir, &self.files_dir] {
                    if dirty.dirs.remove(made) {
                        owed.dirs.insert(made.clone());
                    }
                }
            }
            let record = self.record_to_keep(&dir, meta, committed);
            let staged = record::stage(&*self.disk, &dir, &record)?;
            // The record's new bytes in the same batch as the files the sync owes.
            let record_new = (staged.as_ref())
                .map(|staged| (staged.handle(), format!("the record of file {}", meta.id)));
            sync_owed_files(&*self.disk, &owed, record_new)?;
            let Some(staged) = staged else {
                return Ok(false);
            };
            staged.install()?;
            // The file's directory names the record and the file's files: synced once, here,
            // under the file's lock, and the other directories owed at the same time.
            owed.dirs.remove(&dir);
            sync_owed_dirs(&*self.disk, &owed, Some(&dir))?;
            Ok(true)
        });
        let result = result.and_then(|dirs_synced| match dirs_synced {
            true => Ok(()),
            false => sync_owed_dirs(&*self.disk, &owed, None),
        });
        if result.is_err() {
            self.owe_again(owed);
        }
        result
    }

    /// Removes the `unsynced` mark if every answered write is durable: no write holds the
    /// mark and nothing is owed a sync. Taken under the sync lock: a sync that has taken the
    /// owed files from the dirty set but not yet synced them leaves the set empty, and the
    /// mark must not go until it is done (the sync lock is held across both). A write that
    /// starts meanwhile holds the mark or has made something owed, so the mark stays.
    pub fn clear_unsynced_mark(&self) -> Result<(), StorageError> {
        let _one_at_a_time = lock(&self.sync_lock);
        self.unsynced.clear_if(&*self.disk, || {
            // Not nested: a record's write takes the intents, then the dirty set.
            let records_durable =
                lock(&self.intents).unsynced.is_empty() && lock(&self.stale).unsynced.is_empty();
            let dirty = lock(&self.dirty);
            records_durable
                && dirty.files.is_empty()
                && dirty.snapshot_files.is_empty()
                && dirty.dirs.is_empty()
        })
    }

    /// Whether the `unsynced` mark is on disk (tests).
    #[doc(hidden)]
    pub fn unsynced_mark_present(&self) -> bool {
        matches!(self.disk.kind(&self.root.join("unsynced")), Ok(Some(_)))
    }

    /// Takes the seal of each overflow log and snapshot journal `owed` syncs at its length
    /// (`seal.rs`), under the file's lock, and adds them to `owed`, to be written once the
    /// logs are durable.
    fn seal_logs(&self, owed: &mut Dirty) -> Result<(), StorageError> {
        let overflow_logs = (owed.files.keys())
            .filter(|(_, kind)| *kind == FileKind::OverflowLog)
            .map(|&(file, _)| (file, false));
        let journals = (owed.snapshot_files.keys())
            .filter(|(_, name)| name == JOURNAL_NAME)
            .map(|&(file, _)| (file, true));
        let logs: Vec<(FileId, bool)> = overflow_logs.chain(journals).collect();
        for (file, journal) in logs {
            let sealed = self.with_write(file, |state| match state {
                FileState::Present(present) if journal => present.snap.seal(),
                FileState::Present(present) => present.overflow.seal().map(Some),
                _ => Ok(None),
            })?;
            if let Some((seal, created)) = sealed {
                owed.seals.insert((file, journal), seal);
                if created {
                    owed.dirs.insert(self.file_dir(file));
                }
            }
        }
        Ok(())
    }

    /// Keeps `meta` as the file's record (see [`FileRecord`]), stamped with the cluster this
    /// store joined, durably before returning; an unchanged record is not rewritten. Once a
    /// record says the file was committed it keeps saying so: `committed` false means "not
    /// known to be", as a sync that does not know tells.
    pub fn describe(&self, meta: &FileMeta, committed: bool) -> Result<(), StorageError> {
        self.with_write(meta.id, |state| {
            self.make_present(meta.id, state)?;
            let dir = self.file_dir(meta.id);
            let record = self.record_to_keep(&dir, meta, committed);
            // The record's directory sync made every entry of the directory durable (a new
            // file's six files): the next sync need not sync it again (one sync call less
            // per server on a put's path). Entries are made only under the file's lock,
            // held here, so none came between that sync and this.
            if record::save(&*self.disk, &dir, &record)? {
                lock(&self.dirty).dirs.remove(&dir);
            }
            Ok(())
        })?;
        // The file's directory may be new: its entry must be durable before the record is.
        let created = lock(&self.dirty).dirs.remove(&self.files_dir);
        if created {
            meta::sync_dir(&*self.disk, &self.files_dir)?;
        }
        Ok(())
    }

    /// The record `meta` makes of the file in `dir`, stamped with the cluster this store
    /// joined; committed if `committed` or if the record there already says so (it sticks).
    fn record_to_keep(&self, dir: &Path, meta: &FileMeta, committed: bool) -> FileRecord {
        let was_committed =
            matches!(record::load(&*self.disk, dir), Ok(Some(old)) if old.committed);
        FileRecord {
            meta: meta.clone(),
            cluster: self.cluster_id(),
            committed: committed || was_committed,
        }
    }

    /// Up to `limit` files with an id above `after`, in file id order: their records, or
    /// whether their record is damaged or missing.
    pub fn records(&self, after: FileId, limit: usize) -> Result<RecordPage, StorageError> {
        let names = self
            .disk
            .read_dir(&self.files_dir)
            .map_err(|error| disk(format_args!("list {}", self.files_dir.display()), error))?;
        let mut ids = Vec::new();
        for name in names {
            match name.parse::<FileId>() {
                Ok(id) if id > after => ids.push(id),
                _ => {}
            }
        }
        ids.sort_unstable();
        let mut page = RecordPage::default();
        for &id in &ids {
            if page.records.len() + page.damaged.len() + page.unrecorded.len() == limit {
                page.more = true;
                return Ok(page);
            }
            // Under the file's lock, so that a record being replaced is read whole.
            let slot = self.slot(id);
            let _state = read_state(&slot);
            match record::load(&*self.disk, &self.file_dir(id)) {
                Ok(Some(record)) => page.records.push(record),
                Ok(None) => page.unrecorded.push(id),
                Err(RecordError::Damaged(_)) => page.damaged.push(id),
                Err(RecordError::Disk(error)) => return Err(error),
            }
        }
        Ok(page)
    }

    /// Deletes everything stored for a file. Removing a file that is not stored is fine.
    pub fn remove(&self, file: FileId) -> Result<(), StorageError> {
        let dir = self.file_dir(file);
        let slot = self.slot(file);
        let mut state = write_state(&slot);
        if let Err(error) = remove_dir_if_any(&*self.disk, &dir, "remove") {
            // Some files may be gone: forget what was loaded and look again next time.
            *state = FileState::Unloaded;
            return Err(error);
        }
        *state = FileState::Absent;
        self.forget_records(file, &dir)?;
        // Bytes kept of a removed file are never to be put back.
        self.kept_bytes(file, KeptAction::Drop).map(|_| ())
    }

    /// Drops the records and unsynced writes of a file whose directory just went.
    fn forget_records(&self, file: FileId, dir: &Path) -> Result<(), StorageError> {
        let mut intents = lock(&self.intents);
        let intents_changed = intents.clear_file(file)?;
        let mut stale = lock(&self.stale);
        let stale_changed = stale.clear_file(file)?;
        let mut dirty = lock(&self.dirty);
        if intents_changed {
            dirty.dirs.insert(intents.dir().to_path_buf());
        }
        if stale_changed {
            dirty.dirs.insert(stale.dir().to_path_buf());
        }
        dirty.files.retain(|(owner, _), _| *owner != file);
        dirty.snapshot_files.retain(|(owner, _), _| *owner != file);
        dirty.dirs.remove(dir);
        dirty.dirs.insert(self.files_dir.clone());
        Ok(())
    }

    /// The bytes of `file` this store kept when it renewed itself after a power loss
    /// (`kept.rs`): whether there were any (or they were put back and not yet dropped), and
    /// `action` done with them. Restoring puts them in place of what the store holds of the
    /// file now (durably before the answer), without its records: the caller resyncs the
    /// file's parity from its data. Restoring bytes put back already does nothing.
    pub fn kept_bytes(&self, file: FileId, action: KeptAction) -> Result<bool, StorageError> {
        let kept = kept::KeptFile::of(&self.root, &file.to_string());
        let (held, restored) = kept.state(&*self.disk)?;
        let kept_dir = self.root.join(kept::KEPT_DIR);
        match action {
            KeptAction::Ask => {}
            KeptAction::Drop if held || restored => {
                if held {
                    self.disk.remove_dir_all(&kept.dir).map_err(|error| {
                        disk(format_args!("remove {}", kept.dir.display()), error)
                    })?;
                }
                if restored {
                    self.disk.remove_file(&kept.restored).map_err(|error| {
                        disk(format_args!("remove {}", kept.restored.display()), error)
                    })?;
                }
                meta::sync_dir(&*self.disk, &kept_dir)?;
            }
            KeptAction::Restore if held => self.restore_kept(file, &kept)?,
            KeptAction::Drop | KeptAction::Restore => {}
        }
        Ok(held || restored)
    }

    /// Puts `kept` back as `file`'s directory, and marks it put back.
    fn restore_kept(&self, file: FileId, kept: &kept::KeptFile) -> Result<(), StorageError> {
        let dir = self.file_dir(file);
        let slot = self.slot(file);
        let mut state = write_state(&slot);
        // Whatever happens next, what is loaded may no longer be what is on disk.
        *state = FileState::Unloaded;
        remove_dir_if_any(&*self.disk, &dir, "remove")?;
        self.forget_records(file, &dir)?;
        kept::cut_unsealed_overflow(&*self.disk, &kept.dir)?;
        let fail = |error| disk(format_args!("restore {}", kept.dir.display()), error);
        self.disk.rename(&kept.dir, &dir).map_err(fail)?;
        self.disk.create(&kept.restored).map_err(fail)?;
        // The new name first, as when it was kept.
        meta::sync_dir(&*self.disk, &self.files_dir)?;
        meta::sync_dir(&*self.disk, kept.restored.parent().expect("under kept"))
    }

    /// Deletes the files the manager removed (its list of this server's orphans) and keeps
    /// their ids as tombstones, durably before anything is deleted: from then on a write that
    /// would make one of them again is refused with [`StorageError::Removed`] (see
    /// `tombstone.rs`). Returns the files deleted; the caller syncs before telling the
    /// manager, as for [`Store::remove`].
    pub fn bury(&self, files: &[FileId]) -> Result<Vec<FileId>, StorageError> {
        {
            let mut tombstones = lock(&self.tombstones);
            if tombstones.insert(files) {
                tombstones.save()?;
            }
        }
        Ok(files
            .iter()
            .copied()
            .filter(|&file| self.remove(file).is_ok())
            .collect())
    }

    /// Whether `file` was removed by the manager and buried here ([`Store::bury`]).
    pub fn is_buried(&self, file: FileId) -> bool {
        lock(&self.tombstones).contains(file)
    }

    /// Disjoint ranges of buried file ids kept (at most
    /// [`crate::TOMBSTONE_RANGES_MAX`]).
    pub fn tombstone_ranges(&self) -> usize {
        lock(&self.tombstones).ranges()
    }

    /// The directory of a file's files.
    fn file_dir(&self, file: FileId) -> PathBuf {
        self.files_dir.join(file.to_string())
    }

    /// The slot of a file, cached; drops idle slots when the cache is full.
    fn slot(&self, file: FileId) -> Arc<FileSlot> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(&file) {
            return Arc::clone(slot);
        }
        if slots.len() >= OPEN_FILES_MAX {
            // A slot held only by the map has no operation in flight; its state is rebuilt
            // from disk when next needed.
            let idle: Vec<FileId> = slots
                .iter()
                .filter(|(_, slot)| Arc::strong_count(slot) == 1)
                .map(|(&id, _)| id)
                .take(slots.len() + 1 - OPEN_FILES_MAX * 3 / 4)
                .collect();
            for id in idle {
                slots.remove(&id);
            }
        }
        let slot = Arc::new(FileSlot {
            state: RwLock::new(FileState::Unloaded),
        });
        slots.insert(file, Arc::clone(&slot));
        slot
    }

    /// Runs `op` with the file's state shared, loading it first if needed.
    fn with_read<T>(
        &self,
        file: FileId,
        op: impl FnOnce(&FileState) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let slot = self.slot(file);
        loop {
            {
                let state = read_state(&slot);
                if !matches!(*state, FileState::Unloaded) {
                    return op(&state);
                }
            }
            let mut state = write_state(&slot);
            if matches!(*state, FileState::Unloaded) {
                *state = self.load(file)?;
            }
        }
    }

    /// Runs `op` with the file's state owned, loading it first if needed.
    fn with_write<T>(
        &self,
        file: FileId,
        op: impl FnOnce(&mut FileState) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let slot = self.slot(file);
        let mut state = write_state(&slot);
        if matches!(*state, FileState::Unloaded) {
            *state = self.load(file)?;
        }
        op(&mut state)
    }

    /// Looks a file up on disk: absent, or present with its files opened and its overflow
    /// log replayed.
    fn load(&self, file: FileId) -> Result<FileState, StorageError> {
        let dir = self.file_dir(file);
        match self.disk.kind(&dir) {
            Ok(Some(EntryKind::Dir)) => {
                Ok(FileState::Present(Box::new(self.open_files(file, &dir)?)))
            }
            Ok(Some(EntryKind::File)) => {
                Err(disk_format(format!("{} is not a directory", dir.display())))
            }
            Ok(None) => Ok(FileState::Absent),
            Err(error) => Err(disk(format_args!("stat {}", dir.display()), error)),
        }
    }

    /// Makes sure the file's directory and files exist, creating them on its first write.
    fn make_present<'a>(
        &self,
        file: FileId,
        state: &'a mut FileState,
    ) -> Result<&'a mut FileData, StorageError> {
        if !matches!(state, FileState::Present(_)) {
            // Checked under the file's lock, which `bury` takes only after the tombstone is in:
            // a write that made the file before is deleted with it, one after is refused.
            if lock(&self.tombstones).contains(file) {
                return Err(StorageError::Removed { file });
            }
            let dir = self.file_dir(file);
            match self.disk.create_dir(&dir) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
                Err(error) => return Err(disk(format_args!("create {}", dir.display()), error)),
            }
            lock(&self.dirty).dirs.insert(self.files_dir.clone());
            *state = FileState::Present(Box::new(self.open_files(file, &dir)?));
        }
        match state {
            FileState::Present(present) => Ok(present),
            _ => unreachable!("the file was just made present"),
        }
    }

    /// Opens (creating any missing) the six files of a file id.
    fn open_files(&self, file: FileId, dir: &Path) -> Result<FileData, StorageError> {
        let mut created = false;
        let mut handles = Vec::with_capacity(FileKind::ALL.len());
        for kind in FileKind::ALL {
            let path = dir.join(kind.name());
            let stat = |error| disk(format_args!("stat {}", path.display()), error);
            created |= self.disk.kind(&path).map_err(stat)?.is_none();
            let handle = self
                .disk
                .open(&path)
                .map_err(|error| disk(format_args!("open {}", path.display()), error))?;
            handles.push(handle);
        }
        let mut handles = handles.into_iter();
        let mut next = || handles.next().expect("six handles were opened");
        let mut data = RegionFile::open(file, Region::Data, next(), next())?;
        let mut redundancy = RegionFile::open(file, Region::Redundancy, next(), next())?;
        CutMark::new(dir, Region::Data).finish(&*self.disk, &mut data)?;
        CutMark::new(dir, Region::Redundancy).finish(&*self.disk, &mut redundancy)?;
        let log_path = dir.join(FileKind::OverflowLog.name());
        let overflow_files = [next(), next()];
        let (overflow, touched, damage) =
            OverflowFiles::open(file, overflow_files, Arc::clone(&self.disk), log_path)?;
        if damage.sealed_records_lost {
            tracing::warn!(
                "overflow log of file {file} in {} is shorter than a sync left it: every \
                 overflow range reports corrupt until repaired from redundancy",
                self.root.display()
            );
        }
        if damage.header_rewritten || damage.records_damaged > 0 {
            tracing::warn!(
                "overflow log of file {file} in {}: {} damaged record(s){}; reads of the \
                 ranges they may have changed report corrupt until repaired from redundancy",
                self.root.display(),
                damage.records_damaged,
                if damage.header_rewritten {
                    ", damaged header rewritten"
                } else {
                    ""
                }
            );
        }
        let snap = Snapshots::open(file, dir, Arc::clone(&self.disk))?;
        let present = FileData {
            data,
            redundancy,
            overflow,
            snap,
        };
        if created {
            lock(&self.dirty).dirs.insert(dir.to_path_buf());
        }
        self.mark_overflow_dirty(file, &present, touched);
        Ok(present)
    }

    /// Records that these files of `file` were written and must be synced.
    fn mark_dirty(&self, file: FileId, present: &FileData, kinds: &[FileKind]) {
        let mut dirty = lock(&self.dirty);
        for &kind in kinds {
            // The current handle: a log replaced by a shorter one has a new one.
            dirty
                .files
                .insert((file, kind), Arc::clone(present.handle(kind)));
        }
    }

    /// Records that these snapshot files of `file` were written and must be synced.
    fn mark_snapshot_dirty(&self, file: FileId, written: Vec<Written>) {
        if written.is_empty() {
            return;
        }
        let mut dirty = lock(&self.dirty);
        for (name, handle) in written {
            dirty.snapshot_files.insert((file, name), handle);
        }
        // A copy file is made on its first copy (`snap.<epoch>.<region>` and its `.crc`), and
        // its name is durable only once the file's directory is synced. Without this, a sync
        // made the copies' bytes durable and not their names: after a power loss the journal
        // said the blocks were copied, the copy files were gone, and the snapshot read their
        // blocks as zeros (found in session 28). Owed with every sync that carries copies: one
        // directory sync more, only after a snapshot began.
        dirty.dirs.insert(self.file_dir(file));
    }

    fn mark_overflow_dirty(&self, file: FileId, present: &FileData, touched: Touched) {
        let kinds: &[FileKind] = match (touched.bytes, touched.log) {
            (true, true) => &[FileKind::Overflow, FileKind::OverflowLog],
            (true, false) => &[FileKind::Overflow],
            (false, true) => &[FileKind::OverflowLog],
            (false, false) => &[],
        };
        self.mark_dirty(file, present, kinds);
    }
}

/// Syncs what a sync owes: files first, then the directories that name them.
fn sync_owed(disk: &dyn Disk, owed: &Dirty) -> Result<(), StorageError> {
    sync_owed_files(disk, owed, None)?;
    sync_owed_dirs(disk, owed, None)
}

/// The file part of [`sync_owed`]: snapshot copies, then written files (and `also`, a
/// record's new bytes), then seals, each group's `fdatasync`s issued at once (see
/// [`sync_at_once`]).
fn sync_owed_files(
    disk: &dyn Disk,
    owed: &Dirty,
    also: Option<(&FileHandle, String)>,
) -> Result<(), StorageError> {
    // Snapshot copies first: they must be durable no later than the writes they preceded.
    let copies = (owed.snapshot_files.iter())
        .map(|((file, name), handle)| (handle, format!("{name} of file {file}")));
    sync_at_once(copies.collect())?;
    let files = (owed.files.iter())
        .map(|((file, kind), handle)| (handle, format!("{} of file {file}", kind.name())));
    let records = (owed.intent_records.iter())
        .chain(&owed.stale_records)
        .map(|(path, handle)| (handle, format!("record {}", path.display())));
    sync_at_once(files.chain(records).chain(also).collect())?;
    // Seals written only now and synced last: a seal on the disk before its log's records
    // would make the log look cut short (`seal.rs`).
    let mut seals = Vec::with_capacity(owed.seals.len());
    for ((file, _), due) in &owed.seals {
        if let Some(handle) = due.write(disk)? {
            seals.push((handle, format!("a log's seal of file {file}")));
        }
    }
    sync_at_once(
        seals
            .iter()
            .map(|(handle, what)| (handle, what.clone()))
            .collect(),
    )
}

/// Threads a sync issues its file syncs from, at most.
const SYNC_THREADS_MAX: usize = 8;

/// `fdatasync`s every file of `files` (each with what it is, for the error), at once
/// ([`at_once`]): the syncs of one batch are independent, and issued together the file
/// system commits its journal for all of them at once, so a batch costs about one round of
/// disk latency instead of one per file. Returns when all are done; the first error, if any.
fn sync_at_once(files: Vec<(&FileHandle, String)>) -> Result<(), StorageError> {
    at_once(&files, |(handle, what)| {
        (handle.sync_data()).map_err(|error| self::disk(format_args!("sync {what}"), error))
    })
}

/// Runs `each` over `items` from up to [`SYNC_THREADS_MAX`] scoped threads at once (one
/// item: on this thread). Returns when all are done; the first error, if any.
fn at_once<T: Sync>(
    items: &[T],
    each: impl Fn(&T) -> Result<(), StorageError> + Sync,
) -> Result<(), StorageError> {
    if items.len() <= 1 {
        return items.iter().try_for_each(each);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = items.len().min(SYNC_THREADS_MAX);
    let results: Vec<Result<(), StorageError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| loop {
                    let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(at) else {
                        return Ok(());
                    };
                    each(item)?;
                })
            })
            .collect();
        (workers.into_iter())
            .map(|worker| worker.join().expect("a sync thread does not panic"))
            .collect()
    });
    results.into_iter().collect()
}

/// The directory part of [`sync_owed`], after the files they name are durable: every
/// directory at once ([`at_once`]; one needs no other durable first, and all are before
/// the sync answers), and `also` with them.
fn sync_owed_dirs(disk: &dyn Disk, owed: &Dirty, also: Option<&Path>) -> Result<(), StorageError> {
    let dirs: Vec<&Path> = owed
        .dirs
        .iter()
        .map(|dir| dir.as_path())
        .chain(also)
        .collect();
    at_once(&dirs, |dir| match disk.sync_dir(dir) {
        Ok(()) => Ok(()),
        // Removed since; its parent is owed a sync instead.
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        Err(error) => Err(self::disk(
            format_args!("sync directory {}", dir.display()),
            error,
        )),
    })
}

/// The store's `store.toml`, or a new store's (any file directories left deleted).
fn load_or_create_meta(
    disk: &dyn Disk,
    root: &Path,
    files_dir: &Path,
) -> Result<StoreMeta, StorageError> {
    if let Some(meta) = meta::load(disk, root)? {
        let kind = disk
            .kind(files_dir)
            .map_err(|error| self::disk(format_args!("stat {}", files_dir.display()), error))?;
        if kind != Some(EntryKind::Dir) {
            return Err(disk_format(format!(
                "{} has a {} but no {FILES_DIR} directory: the store was partly wiped; remove \
                 the whole directory to start afresh",
                root.display(),
                meta::META_FILE
            )));
        }
        return Ok(meta);
    }
    refuse_stored_without_meta(disk, root)?;
    clear_files(disk, root, files_dir)?;
    let meta = StoreMeta {
        // Never 0: the manager names an unregistered server's store 0, which then matches no
        // store.
        incarnation: rand::random::<u64>().max(1),
        server_id: None,
        cluster_id: None,
    };
    meta::save(disk, root, &meta)?;
    Ok(meta)
}

/// Keeps each stripe whose intent record is damaged (answered, so its writer may have died
/// between data and parity, and its old parity and data are gone) as an orphaned stale-parity
/// record: nothing reconstructs from that parity (a lost column of the stripe reads as an
/// error), and the next lock holder or the torn-stripe resolver recomputes it from the data,
/// which is right whatever mix of old and new blocks the columns hold. Then the damaged
/// records go.
fn keep_damaged_intents_as_stale(
    disk: &dyn Disk,
    intents: &mut Intents,
    stale: &mut StaleRecords,
    damaged: &[(FileId, u64)],
) -> Result<(), StorageError> {
    let now = tokio::time::Instant::now();
    for &(file, stripe) in damaged {
        let stripes = IndexRange::new(stripe, stripe.saturating_add(1));
        if !stripes.is_empty() {
            stale.record(file, stripes, now)?;
        }
    }
    intents.drop_damaged(damaged)?;
    if damaged.is_empty() {
        return Ok(());
    }
    meta::sync_dir(disk, intents.dir())
}

/// Refuses a store that holds files or records but no `store.toml`: its description was
/// deleted or lost, not never written (a new store writes it, durably, before it stores
/// anything). Starting it as a new store would delete every byte it holds and take a new
/// identity; the operator decides instead (restore the file, or start on an empty directory
/// and rebuild), as for a damaged one.
fn refuse_stored_without_meta(disk: &dyn Disk, root: &Path) -> Result<(), StorageError> {
    for dir in [FILES_DIR, INTENTS_DIR, STALE_DIR] {
        let path = root.join(dir);
        let names = match disk.read_dir(&path) {
            Ok(names) => names,
            Err(error) if error.kind() == ErrorKind::NotFound => continue,
            Err(error) => return Err(self::disk(format_args!("list {}", path.display()), error)),
        };
        let names: Vec<&String> = names.iter().filter(|n| *n != ROSTER_NAME).collect();
        if !names.is_empty() {
            return Err(disk_format(format!(
                "{} is missing but {} holds {} entries: the store's description was lost; \
                 restore it, or move the directory away, start on an empty one and `tessera \
                 rebuild` this server",
                root.join(meta::META_FILE).display(),
                path.display(),
                names.len()
            )));
        }
    }
    Ok(())
}

/// Deletes every file directory and intent record: a new incarnation holds nothing.
fn clear_files(disk: &dyn Disk, root: &Path, files_dir: &Path) -> Result<(), StorageError> {
    for dir in [files_dir.to_path_buf(), root.join(kept::KEPT_DIR)] {
        remove_dir_if_any(disk, &dir, "clear")?;
    }
    clear_records(disk, root)?;
    disk.create_dir(files_dir)
        .map_err(|error| self::disk(format_args!("create {}", files_dir.display()), error))?;
    meta::sync_dir(disk, root)
}

/// `meta` with a new incarnation, and nothing stored, if the machine went down while answered
/// writes were not synced (see `boot.rs`): the manager then has the store rebuilt from the
/// others, as a wiped one. The bytes are kept aside (`kept.rs`), never served as they are: a
/// rebuild puts them back where no other server of a file is left to rebuild it from.
fn renew_if_writes_lost(
    disk: &dyn Disk,
    root: &Path,
    files_dir: &Path,
    meta: StoreMeta,
) -> Result<StoreMeta, StorageError> {
    if !boot::writes_lost(disk, root)? {
        boot::record_boot(disk, root)?;
        return Ok(meta);
    }
    kept::keep_files(disk, root, files_dir)?;
    clear_records(disk, root)?;
    let renewed = StoreMeta {
        incarnation: rand::random::<u64>().max(1),
        ..meta
    };
    meta::save(disk, root, &renewed)?;
    // Only now: a crash before this renews the store again at the next open.
    boot::record_boot(disk, root)?;
    tracing::warn!(
        "{}: the machine went down while answered writes were not synced; they may be lost, \
         so this store starts empty as a new incarnation ({:016x}) and the manager has it \
         rebuilt (its bytes are kept aside for a rebuild that has nothing else to go on)",
        root.display(),
        renewed.incarnation
    );
    Ok(renewed)
}

/// Deletes the intent and stale-parity records: a renewed store owes every stripe, and the
/// stripes whose kept bytes are put back have their parity resynced from the data.
fn clear_records(disk: &dyn Disk, root: &Path) -> Result<(), StorageError> {
    for dir in [root.join(INTENTS_DIR), root.join(STALE_DIR)] {
        remove_dir_if_any(disk, &dir, "clear")?;
    }
    meta::sync_dir(disk, root)
}

/// Removes `dir` and everything under it, if it exists; `what` names the step in an error.
fn remove_dir_if_any(disk: &dyn Disk, dir: &Path, what: &str) -> Result<(), StorageError> {
    match disk.remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        Err(error) => Err(self::disk(format_args!("{what} {}", dir.display()), error)),
    }
}

/// Creates the store's root and any missing parents, durably: a directory's entry is durable
/// only once its parent is synced, and a power loss must not take a new store with it.
fn create_root(disk: &dyn Disk, root: &Path) -> Result<(), StorageError> {
    let fail = |error| self::disk(format_args!("create {}", root.display()), error);
    let mut missing = Vec::new();
    for dir in root.ancestors() {
        if dir.as_os_str().is_empty() || disk.kind(dir).map_err(fail)?.is_some() {
            break;
        }
        missing.push(dir);
    }
    disk.create_dir_all(root).map_err(fail)?;
    for dir in missing.iter().rev() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            meta::sync_dir(disk, parent)?;
        }
    }
    Ok(())
}

/// Takes the store's exclusive lock file, so two servers never share one directory.
fn lock_root(disk: &dyn Disk, root: &Path) -> Result<DiskLock, StorageError> {
    let path = root.join(LOCK_FILE);
    match disk.lock(&path) {
        Ok(lock) => Ok(lock),
        Err(error) if error.kind() == ErrorKind::WouldBlock => Err(disk_format(format!(
            "{} is in use by another open store",
            root.display()
        ))),
        Err(error) => Err(self::disk(format_args!("lock {}", path.display()), error)),
    }
}

/// Locks a mutex whose data stays consistent at every step, so a poisoned one is still fine.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Shares a file's state. If an operation panicked while owning it, the in-memory state may
/// disagree with the disk, so it is forgotten and reloaded.
/// A read's range and overlay flag, checked.
fn check_read(region: Region, offset: u64, len: u32, overlay: bool) -> Result<(), StorageError> {
    check_range(offset, u64::from(len), u64::from(REQUEST_BYTES_MAX))?;
    if overlay && region == Region::Redundancy {
        return Err(bad_request(
            "overlay applies to the data file only; overflow entries are not parity",
        ));
    }
    Ok(())
}

fn read_state(slot: &FileSlot) -> RwLockReadGuard<'_, FileState> {
    loop {
        match slot.state.read() {
            Ok(state) => return state,
            Err(poisoned) => {
                drop(poisoned);
                drop(write_state(slot));
            }
        }
    }
}

/// Owns a file's state; see [`read_state`] for poisoning.
fn write_state(slot: &FileSlot) -> RwLockWriteGuard<'_, FileState> {
    match slot.state.write() {
        Ok(state) => state,
        Err(poisoned) => {
            let mut state = poisoned.into_inner();
            *state = FileState::Unloaded;
            slot.state.clear_poison();
            state
        }
    }
}

/// [`Store::overflow_repair_damaged`]'s entries: inside `offset..offset+len`, in offset
/// order without overlapping, each non-empty and at most a request's bytes, their lengths
/// summing to `bytes`.
fn check_repair_entries(
    offset: u64,
    len: u64,
    entries: &[tessera_wire::OverflowExtent],
    bytes: &[u8],
) -> Result<(), StorageError> {
    let mut at = offset;
    let mut total = 0u64;
    for entry in entries {
        let end = entry.offset.checked_add(u64::from(entry.len));
        let inside = end.is_some_and(|end| entry.offset >= at && end <= offset + len);
        if entry.len == 0 || entry.len > REQUEST_BYTES_MAX || !inside {
            return Err(bad_request(format!(
                "overflow repair entry {}+{} is empty, too long, overlaps another or lies \
                 outside {offset}+{len}",
                entry.offset, entry.len
            )));
        }
        at = end.expect("checked");
        total += u64::from(entry.len);
    }
    if total != bytes.len() as u64 {
        return Err(bad_request(format!(
            "overflow repair entries hold {total} bytes, the payload {}",
            bytes.len()
        )));
    }
    Ok(())
}
