//! The FUSE operations over the client library.

use crate::cache::{self, ReadAhead, WriteBack, WritePlan};
use crate::inodes::{Inodes, ROOT};
use crate::runs::{self, FileOrder, Prefetch};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_client::{Client, ClientError, File, LayoutRequest, NamespaceEntry};
use tessera_wire::{join_path, parent_of, ManagerError, Times, TimesOf};

/// How long the kernel may keep attributes and entries without asking again.
const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel is asked to send at once (FUSE's usual page limit, 256 pages).
const MAX_WRITE: u32 = 1 << 20;

/// What a mount is given.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Layout of files created through the mount.
    pub layout: LayoutRequest,
}

/// A directory's entries as `readdir` hands them out: inode, kind, name.
type Listing = Vec<(u64, FileType, String)>;

/// One file open through the mount: the store's file and what is buffered for it.
struct OpenFile {
    file: File,
    write_back: Mutex<WriteBack>,
    read_ahead: Mutex<Option<ReadAhead>>,
    /// The blocks after the last one read, being fetched, in order (at most
    /// [`crate::runs::BLOCKS_AHEAD`]; see [`crate::runs`]).
    prefetch: Mutex<std::collections::VecDeque<Prefetch>>,
    /// The block of the last read, so that only sequential reads fetch ahead.
    last_block: Mutex<Option<u64>>,
    /// Where the file's layout ends (a write past it is refused at once, `EFBIG`).
    bytes_max: u64,
    /// The time of the last write through this handle if it is not yet recorded (it is at
    /// `flush`, `fsync` and `release`; `stat` shows it meanwhile).
    dirty: Mutex<Option<u64>>,
    /// Whether a read through this handle has been counted as an access (see `note_access`).
    accessed: std::sync::atomic::AtomicBool,
    /// Its file was replaced by an empty one (see `replace_with_empty`): the handle's table
    /// entry now names the new file, and a write that took this one before must not land.
    retired: std::sync::atomic::AtomicBool,
}

/// The file system: the client, the inode table and the open files.
pub struct TesseraFs {
    client: Client,
    runtime: tokio::runtime::Handle,
    config: MountConfig,
    inodes: Mutex<Inodes>,
    open: Mutex<HashMap<u64, Arc<OpenFile>>>,
    /// Per file id with a handle open: orders what is sent to the store for it, and holds
    /// the runs in flight (see `file_of`).
    file_locks: Mutex<HashMap<u64, Arc<FileOrder>>>,
    /// Directory listings taken at `opendir`, served by offset to `readdir`.
    listings: Mutex<HashMap<u64, Listing>>,
    next_handle: AtomicU64,
    mounted_at: SystemTime,
    owner: (u32, u32),
    /// Files unlinked while a handle was open on them, by id: moved to their path under
    /// [`ORPHANS`] and removed when the last handle closes (see `unlink`).
    orphans: Mutex<HashMap<u64, String>>,
}

impl OpenFile {
    fn new(file: File, bytes_max: u64) -> OpenFile {
        OpenFile {
            file,
            write_back: Mutex::new(WriteBack::default()),
            read_ahead: Mutex::new(None),
            prefetch: Mutex::new(Default::default()),
            last_block: Mutex::new(None),
            bytes_max,
            dirty: Mutex::new(None),
            accessed: std::sync::atomic::AtomicBool::new(false),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Forgets the blocks read ahead through `handles`.
fn forget_read_ahead(handles: &[Arc<OpenFile>]) {
    for handle in handles {
        *handle.read_ahead.lock().unwrap() = None;
        handle.prefetch.lock().unwrap().clear();
    }
}

/// Answers an operation that returns nothing: done, or the errno it failed with.
fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// The errno a client error stands for.
pub(crate) fn errno(error: &ClientError) -> Errno {
    match error {
        ClientError::Metadata(error) => match error {
            ManagerError::NotFound(_) => Errno::ENOENT,
            ManagerError::Exists(_) => Errno::EEXIST,
            ManagerError::NotEmpty(_) => Errno::ENOTEMPTY,
            ManagerError::IsDir(_) => Errno::EISDIR,
            ManagerError::NotDir(_) => Errno::ENOTDIR,
            ManagerError::Layout(_) => Errno::EINVAL,
            ManagerError::TooLarge { .. } => Errno::EFBIG,
            ManagerError::Forbidden { .. } => Errno::EACCES,
            _ => Errno::EIO,
        },
        ClientError::TooLarge { .. } => Errno::EFBIG,
        _ => Errno::EIO,
    }
}

/// Whether `path` is a file unlinked while open (see [`ORPHANS`]).
fn is_orphan(path: &str) -> bool {
    path.strip_prefix(ORPHANS)
        .is_some_and(|rest| rest.starts_with('/'))
}

fn nanos_to_time(nanos: Option<u64>, fallback: SystemTime) -> SystemTime {
    nanos.map_or(fallback, |n| UNIX_EPOCH + Duration::from_nanos(n))
}

fn time_to_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A time `setattr` was given, in nanoseconds since the Unix epoch.
fn given_nanos(time: TimeOrNow, now: u64) -> u64 {
    match time {
        TimeOrNow::Now => now,
        TimeOrNow::SpecificTime(t) => time_to_nanos(t),
    }
}

/// How old an access time may get before a read records a new one although the file was
/// not modified since (relatime's rule).
const ACCESS_STALE_NANOS: u64 = 24 * 3600 * 1_000_000_000;

/// Whether a read at `now` records an access time (relatime, as Linux mounts by default):
/// if the recorded access is not later than the last modification or change, or is older
/// than a day.
fn access_is_stale(times: &Times, now: u64) -> bool {
    let accessed = times.accessed.or(times.modified).unwrap_or(0);
    let changed = times.modified.max(times.changed).unwrap_or(0);
    accessed <= changed || now.saturating_sub(accessed) >= ACCESS_STALE_NANOS
}

fn now_nanos() -> u64 {
    time_to_nanos(SystemTime::now())
}

/// The block size `statfs` counts in.
const STATFS_BLOCK: u32 = 4096;
/// The longest name `statfs` announces and a lookup or create accepts (the manager limits
/// whole paths, to 4,096 bytes).
const NAME_MAX: u32 = 255;
/// The directory that holds files unlinked while open until their last handle closes, as
/// POSIX wants (they stay readable and writable through those handles). Hidden from the
/// root's listing. A mount that dies leaves them there, visible to `tessera ls`.
pub const ORPHANS: &str = ".tessera-unlinked";

/// Whether a directory listing can show `name`. The store's paths are any strings (the CLI
/// and S3 keys may hold `/x`, `x/` or `a//b`): a name that is empty, `.`, `..` or longer
/// than [`NAME_MAX`] is left out, as the kernel refuses a whole listing that holds one
/// (it was EIO for the directory). Such files stay reachable by the CLI and S3.
fn shown(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && name.len() <= NAME_MAX as usize
}

/// The servers' raw capacity and free bytes in [`STATFS_BLOCK`]s.
fn statfs_blocks(capacity: &tessera_client::Capacity) -> (u64, u64) {
    let block = u64::from(STATFS_BLOCK);
    (
        capacity.total / block,
        capacity.available.min(capacity.total) / block,
    )
}

impl TesseraFs {
    /// A file system over `client`; `runtime` runs the client's futures.
    pub fn new(client: Client, runtime: tokio::runtime::Handle, config: MountConfig) -> TesseraFs {
        // SAFETY: getuid/getgid only read the process's credentials.
        let owner = unsafe { (libc::getuid(), libc::getgid()) };
        TesseraFs {
            client,
            runtime,
            config,
            inodes: Mutex::new(Inodes::default()),
            open: Mutex::new(HashMap::new()),
            file_locks: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            mounted_at: SystemTime::now(),
            owner,
            orphans: Mutex::new(HashMap::new()),
        }
    }

    /// Runs a client call to its end on the runtime, its error as the errno it stands for.
    fn call<T>(
        &self,
        future: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, Errno> {
        self.runtime.block_on(future).map_err(|e| errno(&e))
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        let inodes = self.inodes.lock().unwrap();
        inodes.path(ino.0).map(str::to_string).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        if name.len() > NAME_MAX as usize {
            return Err(Errno::ENAMETOOLONG);
        }
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(join_path(&self.path(parent)?, name))
    }

    /// Attributes of a file or directory; `nlink` is its number of names (for a directory,
    /// 2 plus its subdirectories; 0 for a file unlinked while open).
    fn attr(&self, ino: u64, kind: FileType, size: u64, times: &Times, nlink: u32) -> FileAttr {
        // An entry without a recorded access or change time shows its modification time
        // there (the mount's start if it has none either).
        let time = nanos_to_time(times.modified, self.mounted_at);
        let perm = match kind {
            FileType::Directory => 0o755,
            _ => 0o644,
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: nanos_to_time(times.accessed, time),
            mtime: time,
            ctime: nanos_to_time(times.changed, time),
            crtime: time,
            kind,
            perm,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }

    /// The attributes of `path` as the manager has them, with bytes still buffered here
    /// counted in the size.
    fn stat_path(&self, path: &str) -> Result<FileAttr, Errno> {
        let entry = self.call(self.client.entry(path))?;
        let ino = self.inodes.lock().unwrap().ino(path);
        match entry {
            Some(NamespaceEntry::Dir { times }) => {
                let nlink = self.dir_links(path)?;
                Ok(self.attr(ino, FileType::Directory, 0, &times, nlink))
            }
            Some(NamespaceEntry::File { meta, mut times }) => {
                let size = meta.size.max(self.buffered_end(meta.id));
                let nlink = u32::from(!is_orphan(path));
                if let Some(written) = self.unrecorded_write(meta.id) {
                    times.modified = times.modified.max(Some(written));
                    times.changed = times.changed.max(Some(written));
                }
                Ok(self.attr(ino, FileType::RegularFile, size, &times, nlink))
            }
            None => {
                self.inodes.lock().unwrap().remove(path);
                Err(Errno::ENOENT)
            }
        }
    }

    /// Records `modified` as the modification (and change) time of each directory in
    /// `dirs` (an entry in it was made, removed or renamed), and `changed` as the change time
    /// of each path in `entries` (renamed, or unlinked while open), in one round trip. Best
    /// effort: the change itself is done, and a time that could not be recorded is only a
    /// stale time.
    fn touch_dirs_and(&self, dirs: &[&str], entries: &[&str], now: u64) {
        let client = &self.client;
        let updates = dirs.iter().map(|dir| (*dir, Times::modified_at(now)));
        let updates: Vec<(&str, Times)> = updates
            .chain(entries.iter().map(|entry| (*entry, Times::changed_at(now))))
            .collect();
        let calls = updates
            .iter()
            .map(|(path, times)| client.set_times(TimesOf::Path(path.to_string()), *times));
        for ((path, _), result) in updates
            .iter()
            .zip(self.runtime.block_on(futures::future::join_all(calls)))
        {
            if let Err(e) = result {
                tracing::debug!("times of '{path}' not recorded: {e}");
            }
        }
    }

    /// See [`touch_dirs_and`](Self::touch_dirs_and), for directories only.
    fn touch_dirs(&self, dirs: &[&str], modified: u64) {
        self.touch_dirs_and(dirs, &[], modified);
    }

    /// The latest write to file `id` through a handle open on it whose time is not yet
    /// recorded.
    fn unrecorded_write(&self, id: u64) -> Option<u64> {
        let open = self.open.lock().unwrap();
        let handles = open.values().filter(|f| f.file.id == id);
        handles.filter_map(|f| *f.dirty.lock().unwrap()).max()
    }

    /// Forgets the unrecorded write times of file `id`: the times about to be recorded
    /// (a truncation's, `utimensat`'s) are later and must not be overwritten by them.
    fn forget_unrecorded_writes(&self, id: u64) {
        for handle in self.open.lock().unwrap().values() {
            if handle.file.id == id {
                *handle.dirty.lock().unwrap() = None;
            }
        }
    }

    /// On the first read through `open`, records the access time of the file at `ino` if
    /// relatime's rule says so ([`access_is_stale`]). Best effort, like `touch_dirs`.
    fn note_access(&self, ino: INodeNo, open: &OpenFile) {
        if open.accessed.swap(true, Ordering::SeqCst) {
            return;
        }
        let now = now_nanos();
        let recorded = self.path(ino).and_then(|path| {
            let stale = match self.call(self.client.entry(&path))? {
                Some(NamespaceEntry::File { times, .. }) => access_is_stale(&times, now),
                _ => false,
            };
            if stale {
                let times = Times {
                    accessed: Some(now),
                    ..Times::default()
                };
                self.call(self.client.set_times(TimesOf::Path(path), times))?;
            }
            Ok(())
        });
        if let Err(e) = recorded {
            tracing::debug!("access time not recorded: {e:?}");
        }
    }

    /// A directory's link count: its name, its `.`, and each subdirectory's `..`.
    fn dir_links(&self, path: &str) -> Result<u32, Errno> {
        let listing = self.call(self.client.list_dir(path))?;
        let hidden = usize::from(path.is_empty() && listing.dirs.iter().any(|d| d == ORPHANS));
        let subdirs = listing.dirs.len() - hidden;
        Ok(2u32.saturating_add(u32::try_from(subdirs).unwrap_or(u32::MAX)))
    }

    /// Whether a handle is open on file `id`.
    fn is_open(&self, id: u64) -> bool {
        self.open.lock().unwrap().values().any(|f| f.file.id == id)
    }

    /// Unlinks the file at `path`. A file with a handle open is moved under [`ORPHANS`]
    /// instead, and removed when its last handle closes (`release_orphan`); its new path is
    /// returned.
    fn unlink_path(&self, path: &str) -> Result<Option<String>, Errno> {
        let open_id = match self.call(self.client.entry(path))? {
            Some(NamespaceEntry::File { meta, .. }) if self.is_open(meta.id) => Some(meta.id),
            Some(NamespaceEntry::Dir { .. }) => return Err(Errno::EISDIR),
            _ => None,
        };
        match open_id {
            Some(id) if !is_orphan(path) => {
                let hidden = join_path(ORPHANS, &id.to_string());
                match self.call(self.client.make_dir(ORPHANS)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                self.call(self.client.rename(path, &hidden))?;
                self.inodes.lock().unwrap().rename(path, &hidden);
                self.orphans.lock().unwrap().insert(id, hidden.clone());
                Ok(Some(hidden))
            }
            _ => {
                self.call(self.client.remove(path))?;
                self.inodes.lock().unwrap().remove(path);
                Ok(None)
            }
        }
    }

    /// Removes file `id` if it was unlinked while open and no handle is open on it now.
    fn release_orphan(&self, id: u64) -> Result<(), Errno> {
        if self.is_open(id) {
            return Ok(());
        }
        let Some(hidden) = self.orphans.lock().unwrap().remove(&id) else {
            return Ok(());
        };
        self.call(self.client.remove(&hidden))?;
        self.inodes.lock().unwrap().remove(&hidden);
        Ok(())
    }

    /// Where bytes written through the mount to file `id` and perhaps not yet counted in its
    /// size by the manager end (0 if none are).
    fn buffered_end(&self, id: u64) -> u64 {
        let orders = self.file_locks.lock().unwrap();
        orders.get(&id).map_or(0, |order| order.written_end())
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.open
            .lock()
            .unwrap()
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    fn register(&self, file: File, bytes_max: u64) -> FileHandle {
        let fh = self.next_handle.fetch_add(1, Ordering::SeqCst);
        let open = Arc::new(OpenFile::new(file, bytes_max));
        self.open.lock().unwrap().insert(fh, open);
        FileHandle(fh)
    }

    /// The file at `path` and the largest size its layout allows.
    fn open_path(&self, path: &str) -> Result<(File, u64), Errno> {
        match self.call(self.client.entry(path))? {
            Some(NamespaceEntry::File { meta, .. }) => {
                let bytes_max = meta.layout.file_bytes_max();
                let file = File {
                    id: meta.id,
                    path: meta.path,
                };
                Ok((file, bytes_max))
            }
            Some(NamespaceEntry::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// The order of what is sent to the store for file `id` (see [`FileOrder`]), and the
    /// handles open on it. Every run of buffered bytes, read-ahead fetch and truncation of a
    /// file is started under its lock.
    fn file_of(&self, id: u64) -> (Arc<FileOrder>, Vec<Arc<OpenFile>>) {
        let order = self
            .file_locks
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .clone();
        let open = self.open.lock().unwrap();
        let handles = open.values().filter(|f| f.file.id == id).cloned().collect();
        (order, handles)
    }

    /// Forgets file `id`'s order once no handle is open on it, nothing of it is in flight
    /// and no thread holds it (a thread that does took it from the table under the table's
    /// lock, which is held here), so the table holds only files in use.
    fn forget_order(&self, id: u64) {
        let mut orders = self.file_locks.lock().unwrap();
        let unused = orders
            .get(&id)
            .is_some_and(|order| Arc::strong_count(order) == 1 && order.is_idle());
        let open = self.open.lock().unwrap().values().any(|f| f.file.id == id);
        if unused && !open {
            orders.remove(&id);
        }
    }

    /// Sends what is buffered for every handle open on file `id` and waits for every run of
    /// it in flight (so that a read through any handle sees it, and a failed run is
    /// reported here), then forgets every read-ahead block of that file.
    fn flush_file(&self, id: u64) -> Result<(), Errno> {
        let (order, handles) = self.file_of(id);
        let _order = order.lock.lock().unwrap();
        self.send_runs(&order, &handles, 0..u64::MAX);
        order.settle_all(&self.runtime)
    }

    /// Starts sending the buffered runs of `handles` that overlap `range` (the caller holds
    /// the file's lock); if any was, forgets the read-ahead blocks of all of them.
    fn send_runs(&self, order: &FileOrder, handles: &[Arc<OpenFile>], range: Range<u64>) {
        let mut flushed = false;
        for handle in handles {
            let run = {
                let mut wb = handle.write_back.lock().unwrap();
                let overlaps =
                    !wb.data.is_empty() && wb.offset < range.end && range.start < wb.end();
                if overlaps {
                    wb.take()
                } else {
                    None
                }
            };
            if let Some((offset, data)) = run {
                flushed = true;
                order.start(&self.runtime, &self.client, &handle.file, offset, data);
            }
        }
        if flushed {
            forget_read_ahead(handles);
        }
    }

    /// Sends every buffered run of the file and waits for all of them; a run that failed
    /// fails this too (and stays to be reported by fsync or close).
    fn settled(&self, order: &FileOrder, handles: &[Arc<OpenFile>]) -> Result<(), Errno> {
        self.send_runs(order, handles, 0..u64::MAX);
        order.settle(&self.runtime, &(0..u64::MAX));
        order.failure().map_or(Ok(()), Err)
    }

    /// Records the time of the handle's last write as the file's modification and change
    /// time, if it wrote since it was last recorded.
    fn touch_if_dirty(&self, open: &OpenFile) -> Result<(), Errno> {
        let mut dirty = open.dirty.lock().unwrap();
        if let Some(written) = *dirty {
            self.call(self.client.touch(&open.file, written))?;
            *dirty = None;
        }
        Ok(())
    }

    fn read_block(&self, open: &OpenFile, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let (order, handles) = self.file_of(open.file.id);
        let _order = order.lock.lock().unwrap();
        if open.retired.load(Ordering::SeqCst) {
            // See `write_buffered`: its file was replaced while this read waited.
            return Err(Errno::EIO);
        }
        self.settled(&order, &handles)?;
        let hit = open
            .read_ahead
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|block| block.get(offset, size).map(<[u8]>::to_vec));
        let answer = match hit {
            Some(bytes) => bytes,
            None => self.fetch_block(open, offset, size)?,
        };
        self.prefetch_next(open, cache::block_of(offset));
        Ok(answer)
    }

    /// Reads the block that holds `offset` (the one fetched ahead if it is that one), keeps
    /// it as the handle's read-ahead and answers the read from it.
    fn fetch_block(&self, open: &OpenFile, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let block = cache::block_of(offset);
        let pending = {
            let mut ahead = open.prefetch.lock().unwrap();
            match ahead.front() {
                Some(prefetch) if prefetch.offset == block => ahead.pop_front(),
                _ => {
                    ahead.clear();
                    None
                }
            }
        };
        let fetched = match pending {
            Some(prefetch) => {
                tracing::debug!(offset, size, block, "read-ahead fetched ahead");
                let file_size = prefetch.file_size;
                let data = prefetch.wait(&self.runtime)?;
                ReadAhead {
                    offset: block,
                    data,
                    file_size,
                }
            }
            None => {
                tracing::debug!(offset, size, block, "read-ahead miss");
                let file_size = self.call(self.client.size(&open.file))?;
                let read = self
                    .client
                    .read_at(&open.file, block, cache::READ_AHEAD_BYTES);
                ReadAhead {
                    offset: block,
                    data: Arc::new(self.call(read)?),
                    file_size,
                }
            }
        };
        let answer = match fetched.get(offset, size) {
            Some(bytes) => bytes.to_vec(),
            // The read crosses into the next block: read it as asked.
            None => self.call(self.client.read_at(&open.file, offset, size as u64))?,
        };
        *open.read_ahead.lock().unwrap() = Some(fetched);
        Ok(answer)
    }

    /// After a read of `block` that follows one of the same or the previous block (a
    /// sequential reader), starts fetching the next [`runs::BLOCKS_AHEAD`] blocks that are
    /// neither past the end of the file nor already on their way (the caller holds the
    /// file's lock).
    fn prefetch_next(&self, open: &OpenFile, block: u64) {
        let last = open.last_block.lock().unwrap().replace(block);
        let sequential = last
            .is_some_and(|b| b == block || b.checked_add(cache::READ_AHEAD_BYTES) == Some(block));
        let file_size = match open.read_ahead.lock().unwrap().as_ref() {
            Some(current) if current.offset == block => current.file_size,
            _ => return,
        };
        if !sequential {
            return;
        }
        let len = cache::READ_AHEAD_BYTES;
        let first = block.saturating_add(len);
        let mut ahead = open.prefetch.lock().unwrap();
        if ahead.front().is_some_and(|p| p.offset != first) {
            ahead.clear();
        }
        let mut next = ahead.back().map_or(first, |p| p.offset.saturating_add(len));
        let (runtime, client, file) = (&self.runtime, &self.client, &open.file);
        while ahead.len() < runs::BLOCKS_AHEAD && next < file_size {
            ahead.push_back(Prefetch::start(runtime, client, file, next, len, file_size));
            next = next.saturating_add(len);
        }
    }

    /// A write through handle `open`. Bytes of other handles still buffered where it writes
    /// are older: they are sent first, so that this write lands after them, as it came after
    /// them. Every read-ahead block of the file is forgotten. A write past the file's
    /// largest size is refused here (`EFBIG`), and a run sent earlier that failed fails it.
    fn write_buffered(&self, open: &OpenFile, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > open.bytes_max {
            return Err(Errno::EFBIG);
        }
        let (order, handles) = self.file_of(open.file.id);
        let _order = order.lock.lock().unwrap();
        if let Some(e) = order.failure() {
            return Err(e);
        }
        if open.retired.load(Ordering::SeqCst) {
            // Taken before its file was replaced under it by an `O_TRUNC` open racing this
            // write: refused rather than written into the replaced file.
            return Err(Errno::EIO);
        }
        *open.dirty.lock().unwrap() = Some(now_nanos());
        order.note_written(end);
        let others: Vec<Arc<OpenFile>> = handles
            .iter()
            .filter(|h| !std::ptr::eq(h.as_ref(), open))
            .cloned()
            .collect();
        self.send_runs(&order, &others, offset..end);
        forget_read_ahead(&handles);
        let plan = open.write_back.lock().unwrap().plan(offset, data.len());
        if plan != WritePlan::Buffer {
            let run = open.write_back.lock().unwrap().take();
            if let Some((at, bytes)) = run {
                order.start(&self.runtime, &self.client, &open.file, at, bytes);
            }
        }
        match plan {
            WritePlan::FlushThenWrite => {
                let bytes = data.to_vec();
                order.start(&self.runtime, &self.client, &open.file, offset, bytes);
            }
            _ => open.write_back.lock().unwrap().buffer(offset, data),
        }
        Ok(())
    }

    /// Sets a file's size; bytes past a smaller size read as zeros if it grows again, as
    /// POSIX wants (the store's own shrink only hides them): `Client::truncate` zeroes the
    /// tail of the stripe holding the new end and discards the later stripes at the servers
    /// (writing zeros over a file's whole tail once cost as much as writing it).
    fn truncate(&self, path: &str, size: u64) -> Result<(), Errno> {
        let file = self.call(self.client.open(path))?;
        let (order, handles) = self.file_of(file.id);
        let truncated = {
            let _order = order.lock.lock().unwrap();
            self.forget_unrecorded_writes(file.id);
            // With no handle open on it (an `O_TRUNC` open, whose handle is made after, or
            // `truncate -s 0`), a file cut to nothing is replaced, not zeroed.
            if size == 0 && handles.is_empty() {
                self.truncate_by_replacement(&file, &order)
            } else {
                self.truncate_locked(&file, &order, &handles, size)
            }
        };
        drop((order, handles));
        self.forget_order(file.id);
        truncated
    }

    /// Cuts `file`, which no handle has open, to nothing by replacing it (see
    /// `replace_with_empty`), or by truncating it when it cannot be replaced (the caller
    /// holds the file's lock).
    fn truncate_by_replacement(&self, file: &File, order: &FileOrder) -> Result<(), Errno> {
        // Runs of handles closed before may still be on their way.
        self.settled(order, &[])?;
        order.landed();
        // One request for both the size and the layout.
        let meta = self.call(self.client.meta(file))?;
        let replaced = match meta.size {
            0 => None,
            _ => self.replace_with_empty(file, meta.layout)?,
        };
        match replaced {
            Some(new) => {
                self.repoint_handles(file.id, &new);
                Ok(())
            }
            None => self.truncate_locked(file, order, &[], 0),
        }
    }

    fn truncate_locked(
        &self,
        file: &File,
        order: &FileOrder,
        handles: &[Arc<OpenFile>],
        size: u64,
    ) -> Result<(), Errno> {
        self.settled(order, handles)?;
        order.landed();
        // Blocks read ahead hold the old bytes and the old size.
        forget_read_ahead(handles);
        self.call(self.client.truncate(file, size))?;
        self.call(self.client.touch(file, now_nanos()))
    }

    /// Points the handles open on file `old` (one opened while it was replaced) at `new`;
    /// their old entries are retired, so a write that took one before cannot land in the
    /// replaced file (see `write_buffered`).
    fn repoint_handles(&self, old: u64, new: &File) {
        let mut open = self.open.lock().unwrap();
        for entry in open.values_mut() {
            if entry.file.id == old {
                let fresh = OpenFile::new(new.clone(), entry.bytes_max);
                *fresh.dirty.lock().unwrap() = *entry.dirty.lock().unwrap();
                entry.retired.store(true, Ordering::SeqCst);
                *entry = Arc::new(fresh);
            }
        }
    }

    /// Gives `file`'s path to a new, empty file of its layout in one atomic commit (as `put`
    /// replaces a file) and deletes the old one's data: truncating to nothing costs two
    /// manager requests, not a write of zeros over every byte it held. The new file, or
    /// `None` (nothing changed) when it cannot be made, e.g. too few servers up for its
    /// width: the caller truncates instead.
    fn replace_with_empty(
        &self,
        file: &File,
        layout: tessera_client::Layout,
    ) -> Result<Option<File>, Errno> {
        let layout = LayoutRequest {
            scheme: layout.scheme,
            stripe_unit: layout.stripe_unit,
            width: Some(layout.width),
        };
        let replaced = self.runtime.block_on(async {
            let (pending, open) = self.client.create_pending_open(&file.path, layout).await?;
            if let Err(e) = self.client.commit_upload(&open).await {
                let _ = self.client.abandon_pending(&pending).await;
                return Err(e);
            }
            Ok(open.file().clone())
        });
        match replaced {
            Ok(new) => {
                self.call(self.client.touch(&new, now_nanos()))?;
                Ok(Some(new))
            }
            Err(e) => {
                tracing::debug!(path = %file.path, "truncation by replacement failed: {e}");
                Ok(None)
            }
        }
    }

    fn listing(&self, path: &str) -> Result<Listing, Errno> {
        let listing = self.call(self.client.list_dir(path))?;
        let mut inodes = self.inodes.lock().unwrap();
        let here = inodes.ino(path);
        let parent = inodes.ino(tessera_wire::parent_of(path));
        let mut entries = vec![
            (here, FileType::Directory, ".".to_string()),
            (parent, FileType::Directory, "..".to_string()),
        ];
        for dir in listing.dirs {
            if (path.is_empty() && dir == ORPHANS) || !shown(&dir) {
                continue;
            }
            let ino = inodes.ino(&join_path(path, &dir));
            entries.push((ino, FileType::Directory, dir));
        }
        for (meta, _) in listing.files {
            let name = meta
                .path
                .rsplit('/')
                .next()
                .unwrap_or(&meta.path)
                .to_string();
            if !shown(&name) {
                continue;
            }
            entries.push((inodes.ino(&meta.path), FileType::RegularFile, name));
        }
        Ok(entries)
    }
}

impl fuser::Filesystem for TesseraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        // `O_TRUNC` comes with the open (see `open`), so that the truncation knows no handle
        // of this open exists yet and may replace the file instead of zeroing it.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .child(parent, name)
            .and_then(|path| self.stat_path(&path))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == ROOT {
            let root = self.call(self.client.entry("")).and_then(|entry| {
                let times = match entry {
                    Some(NamespaceEntry::Dir { times }) => times,
                    _ => Times::default(),
                };
                let nlink = self.dir_links("")?;
                Ok(self.attr(ROOT, FileType::Directory, 0, &times, nlink))
            });
            return match root {
                Ok(attr) => reply.attr(&TTL, &attr),
                Err(e) => reply.error(e),
            };
        }
        match self.path(ino).and_then(|path| self.stat_path(&path)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let now = now_nanos();
        // Whatever the call changes (a size, times, or a mode or owner that is not kept),
        // it is a change of the entry: its change time moves (to the one given, if any).
        let times = Times {
            accessed: atime.map(|t| given_nanos(t, now)),
            modified: mtime.map(|t| given_nanos(t, now)),
            changed: Some(ctime.map_or(now, time_to_nanos)),
        };
        let anything = mode.or(uid).or(gid).is_some() || flags.is_some() || ctime.is_some();
        let result = self.path(ino).and_then(|path| {
            if let Some(size) = size {
                self.truncate(&path, size)?;
            }
            if size.is_none() || times.accessed.or(times.modified).is_some() || anything {
                if times.modified.is_some() {
                    if let Some(NamespaceEntry::File { meta, .. }) =
                        self.call(self.client.entry(&path))?
                    {
                        self.forget_unrecorded_writes(meta.id);
                    }
                }
                self.call(self.client.set_times(TimesOf::Path(path.clone()), times))?;
            }
            self.stat_path(&path)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.child(parent, name).and_then(|path| {
            self.call(self.client.make_dir(&path))?;
            self.touch_dirs(&[&path, parent_of(&path)], now_nanos());
            self.stat_path(&path)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|path| {
            // A file still open loses a link: that changes it.
            let hidden = self.unlink_path(&path)?;
            let hidden: Vec<&str> = hidden.as_deref().into_iter().collect();
            self.touch_dirs_and(&[parent_of(&path)], &hidden, now_nanos());
            Ok(())
        });
        reply_empty(reply, result)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|path| {
            self.call(self.client.remove_dir(&path))?;
            self.inodes.lock().unwrap().remove(&path);
            self.touch_dirs(&[parent_of(&path)], now_nanos());
            Ok(())
        });
        reply_empty(reply, result)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            let target = self.call(self.client.entry(&to))?;
            if flags.contains(RenameFlags::RENAME_NOREPLACE) && target.is_some() {
                return Err(Errno::EEXIST);
            }
            // A file replaced while open stays readable through its handles, as if unlinked.
            if let Some(NamespaceEntry::File { meta, .. }) = target {
                if self.is_open(meta.id) && from != to {
                    self.unlink_path(&to)?;
                }
            }
            self.call(self.client.rename(&from, &to))?;
            self.inodes.lock().unwrap().rename(&from, &to);
            // Both directories are modified, and the renamed entry itself is changed.
            let (old_parent, new_parent) = (parent_of(&from), parent_of(&to));
            if old_parent == new_parent {
                self.touch_dirs_and(&[old_parent], &[&to], now_nanos());
            } else {
                self.touch_dirs_and(&[old_parent, new_parent], &[&to], now_nanos());
            }
            Ok(())
        })();
        reply_empty(reply, result)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = self.path(ino).and_then(|path| {
            // With `FUSE_ATOMIC_O_TRUNC` the kernel leaves the truncation to the open.
            if flags.0 & libc::O_TRUNC != 0 {
                self.truncate(&path, 0)?;
            }
            self.open_path(&path)
        });
        match result {
            Ok((file, bytes_max)) => {
                reply.opened(self.register(file, bytes_max), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.child(parent, name).and_then(|path| {
            let file = self.call(self.client.create(&path, self.config.layout.clone()))?;
            // The file's times and its directory's in one round trip; the directory's is best
            // effort (see `touch_dirs`).
            let now = now_nanos();
            let born = Times {
                accessed: Some(now),
                ..Times::modified_at(now)
            };
            let (touched, _) = self.runtime.block_on(futures::future::join(
                self.client.set_times(TimesOf::File(file.id), born),
                self.client.touch_dir(parent_of(&path), now),
            ));
            touched.map_err(|e| errno(&e))?;
            let attr = self.stat_path(&path)?;
            let (_, bytes_max) = self.open_path(&path)?;
            Ok((attr, self.register(file, bytes_max)))
        });
        match result {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self.handle(fh).and_then(|open| {
            self.note_access(ino, &open);
            self.read_block(&open, offset, size)
        }) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        match self
            .handle(fh)
            .and_then(|open| self.write_buffered(&open, offset, data))
        {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        let result = self.handle(fh).and_then(|open| {
            self.flush_file(open.file.id)?;
            self.touch_if_dirty(&open)
        });
        reply_empty(reply, result)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.handle(fh).and_then(|open| {
            self.flush_file(open.file.id)?;
            self.touch_if_dirty(&open)?;
            self.call(self.client.sync(&open.file))
        });
        reply_empty(reply, result)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.handle(fh).and_then(|open| {
            let flushed = self.flush_file(open.file.id);
            let touched = self.touch_if_dirty(&open);
            self.open.lock().unwrap().remove(&fh.0);
            self.forget_order(open.file.id);
            let orphan = self.release_orphan(open.file.id);
            flushed.and(touched).and(orphan)
        });
        reply_empty(reply, result)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.path(ino).and_then(|path| self.listing(&path)) {
            Ok(entries) => {
                let fh = self.next_handle.fetch_add(1, Ordering::SeqCst);
                self.listings.lock().unwrap().insert(fh, entries);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listings = self.listings.lock().unwrap();
        let Some(entries) = listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (index, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), index as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.listings.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes are kept: every name is absent.
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        match self.call(self.client.capacity()) {
            Ok(capacity) => {
                let (blocks, free) = statfs_blocks(&capacity);
                // The namespace has no inode table to run out of: report plenty.
                let files = u64::from(u32::MAX);
                let (block, name) = (STATFS_BLOCK, NAME_MAX);
                reply.statfs(blocks, free, free, files, files - 1, block, name, block);
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every change to the tree is committed by the manager before it is answered.
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_listing_cannot_hold_are_left_out() {
        for name in ["a", ".hidden", "a b", "ü", &"n".repeat(NAME_MAX as usize)] {
            assert!(shown(name), "{name}");
        }
        for name in ["", ".", "..", &"n".repeat(NAME_MAX as usize + 1)] {
            assert!(!shown(name), "{name}");
        }
    }
}
