//! An in-memory [`Disk`] with fault injection, for the whole-cluster simulator: what a power
//! loss does to what was not synced, and bits flipped on the platter.
//!
//! Each file keeps two layers: what reads see now (the page cache) and what is durable, with
//! the writes and truncations since the last [`DiskFile::sync_data`] in order. The names keep
//! two layers too: the namespace as it is now, and as it is durable; a directory's entries
//! (created, renamed, removed) become durable only when it is synced ([`Disk::sync_dir`]), and
//! a directory created anew drops whatever the old one of that name durably held.
//!
//! Faults, each seeded so that a run replays:
//! - [`MemDisk::crash`]: the power goes, and everything not synced is lost;
//! - [`MemDisk::power_loss`]: the power goes, and each write not synced is kept, dropped, or
//!   torn (a random subset of its 512-byte sectors kept); a truncation not synced is kept or
//!   dropped with everything after it in that file (metadata reaches the disk in order);
//!   names not synced are lost. Open files of before the loss fail from then on (the process
//!   died with the power);
//! - [`MemDisk::flip_bit`]: one bit of one file flips, now and durably.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, ErrorKind};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::disk::{Disk, DiskFile, DiskLock, DiskSpace, EntryKind, FileHandle};

/// Bytes a power loss keeps or drops together.
pub const SECTOR_BYTES: u64 = 512;
/// Bytes of one allocation unit (what [`DiskFile::next_data`] reports in).
const PAGE_BYTES: u64 = 4096;
/// The size an in-memory disk reports ([`Disk::space`]): 1 TiB.
pub const MEM_DISK_BYTES: u64 = 1 << 40;

/// An in-memory disk shared by its handles; cloning it shares the same disk.
#[derive(Clone, Debug, Default)]
pub struct MemDisk {
    state: Arc<Mutex<State>>,
}

/// What a power loss did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerLoss {
    /// Unsynced writes that reached the disk whole.
    pub writes_kept: u64,
    /// Unsynced writes lost.
    pub writes_dropped: u64,
    /// Unsynced writes of which only some sectors reached the disk.
    pub writes_torn: u64,
    /// Unsynced truncations lost (with what followed them in their file).
    pub truncations_dropped: u64,
}

/// A flipped bit: where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitFlip {
    /// The file.
    pub path: PathBuf,
    /// The byte.
    pub offset: u64,
    /// The bit of that byte, 0..8.
    pub bit: u8,
}

/// Read-ahead hints a memory disk remembers (the newest; a long simulation gives many).
const ADVICE_KEPT_MAX: usize = 4096;

#[derive(Debug, Default, Clone)]
struct State {
    inodes: BTreeMap<u64, Inode>,
    /// Names as reads see them.
    names: BTreeMap<PathBuf, Node>,
    /// Names as they are durable.
    durable_names: BTreeMap<PathBuf, Node>,
    next_id: u64,
    /// Power cycles so far: handles of an earlier one fail.
    boot: u64,
    /// Locked paths, with the boot that took them.
    locks: HashMap<PathBuf, u64>,
    /// Read-ahead hints given ([`DiskFile::advise_will_need`]): inode, offset, length.
    advice: Vec<(u64, u64, u64)>,
    /// [`Disk::sync_dir`] calls per directory (what a sync costs, for tests).
    dir_syncs: BTreeMap<PathBuf, u64>,
    /// [`DiskFile::sync_data`] calls (what a sync costs, for tests).
    file_syncs: u64,
    /// Changes the disk still takes before its power goes ([`MemDisk::lose_power_after`]).
    changes_left: Option<u64>,
    /// How long a file sync takes ([`MemDisk::slow_file_syncs`]); none by default.
    file_sync_wait: std::time::Duration,
    /// File syncs in progress now, and the most there were at once.
    file_syncs_now: u64,
    file_syncs_at_once_max: u64,
    /// Directory syncs in progress now, and the most there were at once.
    dir_syncs_now: u64,
    dir_syncs_at_once_max: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    /// A directory (the id tells a recreated one apart).
    Dir(u64),
    /// A file, by inode.
    File(u64),
}

#[derive(Debug, Default, Clone)]
struct Inode {
    now: Content,
    durable: Content,
    /// Changes since the last sync, in order.
    pending: Vec<Change>,
}

#[derive(Debug, Clone)]
enum Change {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

/// A file's bytes: a length and the pages written (absent pages are holes, zeros).
#[derive(Debug, Clone, Default)]
struct Content {
    len: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl Content {
    /// Bytes of the pages written (holes cost nothing).
    fn allocated(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> usize {
        if offset >= self.len {
            return 0;
        }
        let count = buf.len().min((self.len - offset) as usize);
        let mut done = 0;
        while done < count {
            let at = offset + done as u64;
            let (page, skip) = (at / PAGE_BYTES, (at % PAGE_BYTES) as usize);
            let take = (PAGE_BYTES as usize - skip).min(count - done);
            match self.pages.get(&page) {
                Some(bytes) => buf[done..done + take].copy_from_slice(&bytes[skip..skip + take]),
                None => buf[done..done + take].fill(0),
            }
            done += take;
        }
        count
    }

    fn write(&mut self, bytes: &[u8], offset: u64) {
        let mut done = 0;
        while done < bytes.len() {
            let at = offset + done as u64;
            let (page, skip) = (at / PAGE_BYTES, (at % PAGE_BYTES) as usize);
            let take = (PAGE_BYTES as usize - skip).min(bytes.len() - done);
            let stored = self
                .pages
                .entry(page)
                .or_insert_with(|| vec![0u8; PAGE_BYTES as usize].into_boxed_slice());
            stored[skip..skip + take].copy_from_slice(&bytes[done..done + take]);
            done += take;
        }
        self.len = self.len.max(offset + bytes.len() as u64);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(PAGE_BYTES);
            self.pages.split_off(&first_gone);
            if let Some(last) = self.pages.get_mut(&(len / PAGE_BYTES)) {
                last[(len % PAGE_BYTES) as usize..].fill(0);
            }
        }
        self.len = len;
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Write { offset, bytes } => self.write(bytes, *offset),
            Change::SetLen(len) => self.set_len(*len),
        }
    }

    fn next_data(&self, offset: u64) -> Option<u64> {
        let (page, _) = self.pages.range(offset / PAGE_BYTES..).next()?;
        let at = offset.max(page * PAGE_BYTES);
        (at < self.len).then_some(at)
    }

    fn next_hole(&self, offset: u64) -> u64 {
        let mut page = offset / PAGE_BYTES;
        while self.pages.contains_key(&page) {
            page += 1;
        }
        (page * PAGE_BYTES).max(offset).min(self.len)
    }
}

/// `path` without `.` components, as the key of the namespace.
fn key(path: &Path) -> PathBuf {
    path.components()
        .filter(|part| !matches!(part, Component::CurDir))
        .collect()
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        ErrorKind::NotFound,
        format!("{}: no such name", path.display()),
    )
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Flips bit `bit` of byte `offset` of inode `id`, now and on the disk.
    fn flip(&mut self, id: u64, offset: u64, bit: u8) {
        let inode = self.inodes.get_mut(&id).expect("a named inode exists");
        for content in [&mut inode.now, &mut inode.durable] {
            if offset < content.len {
                let mut byte = [0u8];
                content.read(&mut byte, offset);
                byte[0] ^= 1 << bit;
                content.write(&byte, offset);
            }
        }
    }

    /// Counts one change (a write, a sync, a name made or removed) against
    /// [`MemDisk::lose_power_after`]: fails, changing nothing, once the power is gone.
    fn change(&mut self) -> io::Result<()> {
        match &mut self.changes_left {
            Some(0) => Err(io::Error::other("the disk lost power")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Whether `path`'s directory exists (the root and a relative path's `""` always do).
    fn parent_exists(&self, path: &Path) -> bool {
        match path.parent() {
            None => true,
            Some(parent) if parent.as_os_str().is_empty() || parent == Path::new("/") => true,
            Some(parent) => matches!(self.names.get(parent), Some(Node::Dir(_))),
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        match self.names.get(path) {
            Some(Node::File(id)) => Ok(*id),
            Some(Node::Dir(_)) => Err(io::Error::new(
                ErrorKind::IsADirectory,
                format!("{} is a directory", path.display()),
            )),
            None => Err(not_found(path)),
        }
    }

    fn create_file(&mut self, path: &Path) -> io::Result<u64> {
        if !self.parent_exists(path) {
            return Err(not_found(path));
        }
        let id = self.new_id();
        self.inodes.insert(id, Inode::default());
        self.names.insert(path.to_path_buf(), Node::File(id));
        Ok(id)
    }

    /// Names strictly under `dir`.
    fn under(names: &BTreeMap<PathBuf, Node>, dir: &Path) -> Vec<PathBuf> {
        names
            .range(dir.to_path_buf()..)
            .skip_while(|(name, _)| *name == dir)
            .take_while(|(name, _)| name.starts_with(dir))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A directory renamed, with everything under it (onto no existing name: the store never
    /// renames a directory over another). The new entry is durable once its directory is
    /// synced, and brings along what the directory durably held under its old name.
    fn rename_dir(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        if !self.parent_exists(to) {
            return Err(not_found(to));
        }
        if self.names.contains_key(to) {
            return Err(ErrorKind::AlreadyExists.into());
        }
        if to.starts_with(from) {
            return Err(ErrorKind::InvalidInput.into());
        }
        self.change()?;
        let mut moved = vec![from.to_path_buf()];
        moved.extend(State::under(&self.names, from));
        for name in moved {
            let node = self.names.remove(&name).expect("listed");
            let below = name.strip_prefix(from).expect("under");
            self.names.insert(to.join(below), node);
        }
        Ok(())
    }

    /// A directory `node` whose entry `name` becomes durable: if it was renamed there, what
    /// it durably held under its old name, as entries under the new one (the entries are the
    /// directory's own, not its parent's).
    fn durable_contents_of(&self, name: &Path, node: Node) -> Vec<(PathBuf, Node)> {
        let Node::Dir(_) = node else {
            return Vec::new();
        };
        let old = self
            .durable_names
            .iter()
            .find(|(other, held)| **held == node && other.as_path() != name)
            .map(|(other, _)| other.clone());
        let Some(old) = old else {
            return Vec::new();
        };
        State::under(&self.durable_names, &old)
            .into_iter()
            .map(|below| {
                let relative = below.strip_prefix(&old).expect("under");
                (name.join(relative), self.durable_names[&below])
            })
            .collect()
    }

    /// The power goes: unsynced names lost, each inode's unsynced changes kept as `decide`
    /// says, handles of before fail from now on.
    fn power_off(&mut self, mut decide: impl FnMut(&Change) -> Fate) -> PowerLoss {
        let mut report = PowerLoss::default();
        self.boot += 1;
        self.changes_left = None;
        self.locks.clear();
        let mut names = std::mem::take(&mut self.durable_names);
        // Names whose directory is not durable are gone with it.
        let orphans: Vec<PathBuf> = names
            .keys()
            .filter(|name| {
                name.ancestors()
                    .skip(1)
                    .take_while(|dir| !dir.as_os_str().is_empty() && *dir != Path::new("/"))
                    .any(|dir| !matches!(names.get(dir), Some(Node::Dir(_))))
            })
            .cloned()
            .collect();
        for orphan in orphans {
            names.remove(&orphan);
        }
        let live: HashSet<u64> = names
            .values()
            .filter_map(|node| match node {
                Node::File(id) => Some(*id),
                Node::Dir(_) => None,
            })
            .collect();
        self.inodes.retain(|id, _| live.contains(id));
        for inode in self.inodes.values_mut() {
            let mut durable = std::mem::take(&mut inode.durable);
            for change in std::mem::take(&mut inode.pending) {
                match (decide(&change), &change) {
                    (Fate::Kept, _) => {
                        report.writes_kept += u64::from(matches!(change, Change::Write { .. }));
                        durable.apply(&change);
                    }
                    (Fate::Dropped, Change::SetLen(_)) => {
                        report.truncations_dropped += 1;
                        break;
                    }
                    (Fate::Dropped, Change::Write { .. }) => report.writes_dropped += 1,
                    (Fate::Torn(keep), Change::Write { offset, bytes }) => {
                        report.writes_torn += 1;
                        tear(&mut durable, *offset, bytes, keep);
                    }
                    (Fate::Torn(_), Change::SetLen(_)) => durable.apply(&change),
                }
            }
            inode.now = durable.clone();
            inode.durable = durable;
        }
        self.names = names.clone();
        self.durable_names = names;
        report
    }
}

/// What a power loss does to one unsynced change.
enum Fate {
    Kept,
    Dropped,
    /// Kept sector by sector: bit `i` of the mask for the write's `i`-th sector (mod 64).
    Torn(u64),
}

/// Applies the sectors of a write that `mask` keeps. The file grows to the end of the last
/// sector kept.
fn tear(content: &mut Content, offset: u64, bytes: &[u8], mask: u64) {
    let end = offset + bytes.len() as u64;
    let mut at = offset;
    let mut index = 0u32;
    while at < end {
        let stop = ((at / SECTOR_BYTES + 1) * SECTOR_BYTES).min(end);
        if mask & (1 << (index % 64)) != 0 {
            let from = (at - offset) as usize;
            content.write(&bytes[from..(stop - offset) as usize], at);
        }
        index += 1;
        at = stop;
    }
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// A copy of the disk as it is now (both layers), apart from this one from then on.
    pub fn snapshot(&self) -> MemDisk {
        MemDisk {
            state: Arc::new(Mutex::new(lock(&self.state).clone())),
        }
    }

    /// This disk as a shared [`Disk`] for [`crate::Store::open_on`].
    pub fn shared(&self) -> Arc<dyn Disk> {
        Arc::new(self.clone())
    }

    /// The power goes and comes back: everything not synced is lost.
    pub fn crash(&self) -> PowerLoss {
        lock(&self.state).power_off(|_| Fate::Dropped)
    }

    /// The power goes and comes back: each unsynced write kept, dropped or torn, each unsynced
    /// truncation kept or dropped, by `seed` (see the module doc).
    pub fn power_loss(&self, seed: u64) -> PowerLoss {
        let mut rng = StdRng::seed_from_u64(seed);
        lock(&self.state).power_off(|change| match (change, rng.gen_range(0..3)) {
            (_, 0) => Fate::Kept,
            (_, 1) => Fate::Dropped,
            (Change::Write { .. }, _) => Fate::Torn(rng.gen()),
            (Change::SetLen(_), _) => Fate::Kept,
        })
    }

    /// Flips one bit, chosen by `seed`, of one non-empty file under `dir`, in what reads see
    /// and on the disk alike. `None` if no file under `dir` holds a byte.
    pub fn flip_bit(&self, dir: &Path, seed: u64) -> Option<BitFlip> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut state = lock(&self.state);
        let dir = key(dir);
        let files: Vec<(PathBuf, u64, u64)> = State::under(&state.names, &dir)
            .into_iter()
            .filter_map(|path| match state.names.get(&path) {
                Some(Node::File(id)) => Some((path, *id, state.inodes[id].now.len)),
                _ => None,
            })
            .filter(|(_, _, len)| *len > 0)
            .collect();
        if files.is_empty() {
            return None;
        }
        let (path, id, len) = files[rng.gen_range(0..files.len())].clone();
        let (offset, bit) = (rng.gen_range(0..len), rng.gen_range(0..8u8));
        state.flip(id, offset, bit);
        Some(BitFlip { path, offset, bit })
    }

    /// Flips bit `bit` of byte `offset` of the file at `path`, in what reads see and on the
    /// disk alike: whether the file holds that byte.
    pub fn flip_bit_at(&self, path: &Path, offset: u64, bit: u8) -> bool {
        let mut state = lock(&self.state);
        let Some(Node::File(id)) = state.names.get(&key(path)) else {
            return false;
        };
        let id = *id;
        if offset >= state.inodes[&id].now.len {
            return false;
        }
        state.flip(id, offset, bit);
        true
    }

    /// The files under `dir` with their lengths as reads see them, in path order.
    pub fn files(&self, dir: &Path) -> Vec<(PathBuf, u64)> {
        let state = lock(&self.state);
        State::under(&state.names, &key(dir))
            .into_iter()
            .filter_map(|path| match state.names.get(&path) {
                Some(Node::File(id)) => Some((path, state.inodes[id].now.len)),
                _ => None,
            })
            .collect()
    }

    /// The read-ahead hints given for the file at `path` so far, `(offset, len)` in order
    /// (a memory disk holds everything in memory anyway: it only records them).
    pub fn advised(&self, path: &Path) -> Vec<(u64, u64)> {
        let state = lock(&self.state);
        let Some(Node::File(id)) = state.names.get(&key(path)) else {
            return Vec::new();
        };
        let id = *id;
        state
            .advice
            .iter()
            .filter(|(inode, _, _)| *inode == id)
            .map(|&(_, offset, len)| (offset, len))
            .collect()
    }

    /// The power goes after `changes` more changes (writes, syncs, names made, renamed or
    /// removed): every change from then on fails and changes nothing, until [`MemDisk::crash`]
    /// or [`MemDisk::power_loss`] brings the power back. A test walks a call through every
    /// point where a power loss may cut it.
    pub fn lose_power_after(&self, changes: u64) {
        lock(&self.state).changes_left = Some(changes);
    }

    /// Whether the power went by [`MemDisk::lose_power_after`] (and has not come back).
    pub fn power_lost(&self) -> bool {
        lock(&self.state).changes_left == Some(0)
    }

    /// Makes every file and directory sync from now on take `wait` (outside the disk's
    /// lock, so syncs issued together overlap), to see how many a store issues at once
    /// ([`MemDisk::file_syncs_at_once_max`], [`MemDisk::dir_syncs_at_once_max`]).
    pub fn slow_file_syncs(&self, wait: std::time::Duration) {
        lock(&self.state).file_sync_wait = wait;
    }

    /// The most file syncs that were in progress at once since the disk was made.
    pub fn file_syncs_at_once_max(&self) -> u64 {
        lock(&self.state).file_syncs_at_once_max
    }

    /// The most directory syncs that were in progress at once since the disk was made.
    pub fn dir_syncs_at_once_max(&self) -> u64 {
        lock(&self.state).dir_syncs_at_once_max
    }

    /// How many times a file was synced ([`DiskFile::sync_data`]) since the disk was made.
    pub fn file_syncs(&self) -> u64 {
        lock(&self.state).file_syncs
    }

    /// How many times `dir` was synced ([`Disk::sync_dir`]) since the disk was made.
    pub fn dir_syncs(&self, dir: &Path) -> u64 {
        let state = lock(&self.state);
        state.dir_syncs.get(&key(dir)).copied().unwrap_or(0)
    }

    /// Writes not yet durable, over all files.
    pub fn unsynced_changes(&self) -> usize {
        let state = lock(&self.state);
        state.inodes.values().map(|inode| inode.pending.len()).sum()
    }

    fn handle(&self, state: &State, id: u64) -> FileHandle {
        Arc::new(MemFile {
            state: Arc::clone(&self.state),
            id,
            boot: state.boot,
        })
    }
}

impl Disk for MemDisk {
    fn open(&self, path: &Path) -> io::Result<FileHandle> {
        let path = key(path);
        let mut state = lock(&self.state);
        let id = match state.file(&path) {
            Ok(id) => id,
            Err(error) if error.kind() == ErrorKind::NotFound => state.create_file(&path)?,
            Err(error) => return Err(error),
        };
        Ok(self.handle(&state, id))
    }

    fn open_existing(&self, path: &Path) -> io::Result<FileHandle> {
        let state = lock(&self.state);
        let id = state.file(&key(path))?;
        Ok(self.handle(&state, id))
    }

    fn create(&self, path: &Path) -> io::Result<FileHandle> {
        let path = key(path);
        let mut state = lock(&self.state);
        state.change()?;
        let id = match state.file(&path) {
            Ok(id) => {
                let inode = state.inodes.get_mut(&id).expect("a named inode exists");
                inode.now.set_len(0);
                inode.pending.push(Change::SetLen(0));
                id
            }
            Err(error) if error.kind() == ErrorKind::NotFound => state.create_file(&path)?,
            Err(error) => return Err(error),
        };
        Ok(self.handle(&state, id))
    }

    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        let path = key(path);
        let state = lock(&self.state);
        if path.parent().is_none() {
            return Ok(Some(EntryKind::Dir));
        }
        Ok(state.names.get(&path).map(|node| match node {
            Node::Dir(_) => EntryKind::Dir,
            Node::File(_) => EntryKind::File,
        }))
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let path = key(path);
        let mut state = lock(&self.state);
        if path.parent().is_none() || state.names.contains_key(&path) {
            return Err(ErrorKind::AlreadyExists.into());
        }
        if !state.parent_exists(&path) {
            return Err(not_found(&path));
        }
        state.change()?;
        let id = state.new_id();
        state.names.insert(path, Node::Dir(id));
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let path = key(path);
        let mut ancestors: Vec<&Path> = path.ancestors().collect();
        ancestors.reverse();
        for dir in ancestors {
            match self.create_dir(dir) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::AlreadyExists => {
                    if self.kind(dir)? != Some(EntryKind::Dir) {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let path = key(path);
        let mut state = lock(&self.state);
        state.file(&path)?;
        state.change()?;
        state.names.remove(&path);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let path = key(path);
        let mut state = lock(&self.state);
        if !matches!(state.names.get(&path), Some(Node::Dir(_))) {
            return Err(not_found(&path));
        }
        state.change()?;
        for name in State::under(&state.names, &path) {
            state.names.remove(&name);
        }
        state.names.remove(&path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from, to) = (key(from), key(to));
        let mut state = lock(&self.state);
        if matches!(state.names.get(&from), Some(Node::Dir(_))) {
            return state.rename_dir(&from, &to);
        }
        let id = state.file(&from)?;
        if !state.parent_exists(&to) {
            return Err(not_found(&to));
        }
        if matches!(state.names.get(&to), Some(Node::Dir(_))) {
            return Err(ErrorKind::IsADirectory.into());
        }
        state.change()?;
        state.names.remove(&from);
        state.names.insert(to, Node::File(id));
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let path = key(path);
        let state = lock(&self.state);
        if path.parent().is_some() && !matches!(state.names.get(&path), Some(Node::Dir(_))) {
            return Err(not_found(&path));
        }
        Ok(State::under(&state.names, &path)
            .into_iter()
            .filter(|name| name.parent() == Some(&path))
            .filter_map(|name| Some(name.file_name()?.to_string_lossy().into_owned()))
            .collect())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let wait = {
            let mut state = lock(&self.state);
            state.dir_syncs_now += 1;
            state.dir_syncs_at_once_max = state.dir_syncs_at_once_max.max(state.dir_syncs_now);
            state.file_sync_wait
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        lock(&self.state).dir_syncs_now -= 1;
        let path = key(path);
        let mut state = lock(&self.state);
        if path.parent().is_some() && !matches!(state.names.get(&path), Some(Node::Dir(_))) {
            return Err(not_found(&path));
        }
        state.change()?;
        *state.dir_syncs.entry(path.clone()).or_default() += 1;
        let children = |names: &BTreeMap<PathBuf, Node>| -> Vec<PathBuf> {
            State::under(names, &path)
                .into_iter()
                .filter(|name| name.parent() == Some(&path))
                .collect()
        };
        // What directories renamed in durably held, taken first: it may be under an old name
        // in this same directory, which the removals below take away; and it goes in last,
        // over a directory durable under that name before, which they take away too.
        let mut carried = Vec::new();
        for name in children(&state.names) {
            let node = state.names[&name];
            if state.durable_names.get(&name) != Some(&node) {
                carried.extend(state.durable_contents_of(&name, node));
            }
        }
        for name in children(&state.durable_names) {
            if state.names.get(&name) != state.durable_names.get(&name) {
                // Gone or replaced: a directory takes what it durably held with it.
                for below in State::under(&state.durable_names, &name) {
                    state.durable_names.remove(&below);
                }
                state.durable_names.remove(&name);
            }
        }
        for name in children(&state.names) {
            let node = state.names[&name];
            state.durable_names.insert(name, node);
        }
        state.durable_names.extend(carried);
        Ok(())
    }

    fn sync_fs(&self, _path: &Path) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.change()?;
        for inode in state.inodes.values_mut() {
            for change in std::mem::take(&mut inode.pending) {
                inode.durable.apply(&change);
            }
        }
        state.durable_names = state.names.clone();
        Ok(())
    }

    /// The power cycles so far.
    fn boot_id(&self) -> u64 {
        lock(&self.state).boot
    }

    fn lock(&self, path: &Path) -> io::Result<DiskLock> {
        let path = key(path);
        self.open(&path)?;
        let mut state = lock(&self.state);
        if state.locks.contains_key(&path) {
            return Err(ErrorKind::WouldBlock.into());
        }
        let boot = state.boot;
        state.locks.insert(path.clone(), boot);
        Ok(Box::new(MemLock {
            state: Arc::clone(&self.state),
            path,
            boot,
        }))
    }

    /// A disk of [`MEM_DISK_BYTES`], less the pages every file holds now.
    fn space(&self, _path: &Path) -> io::Result<DiskSpace> {
        let state = lock(&self.state);
        let used: u64 = state
            .inodes
            .values()
            .map(|inode| inode.now.allocated())
            .sum();
        Ok(DiskSpace {
            total: MEM_DISK_BYTES,
            available: MEM_DISK_BYTES.saturating_sub(used),
        })
    }

    fn allocated(&self, path: &Path) -> io::Result<u64> {
        let path = key(path);
        let state = lock(&self.state);
        let id = state.file(&path)?;
        Ok(state.inodes[&id].now.allocated())
    }
}

/// A held lock of a [`MemDisk`].
struct MemLock {
    state: Arc<Mutex<State>>,
    path: PathBuf,
    boot: u64,
}

impl Drop for MemLock {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if state.locks.get(&self.path) == Some(&self.boot) {
            state.locks.remove(&self.path);
        }
    }
}

/// An open file of a [`MemDisk`].
struct MemFile {
    state: Arc<Mutex<State>>,
    id: u64,
    /// The power cycle it was opened in.
    boot: u64,
}

impl std::fmt::Debug for MemFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemFile({})", self.id)
    }
}

impl MemFile {
    /// Runs `op` on the file's inode, unless the power went since it was opened.
    fn with<T>(&self, op: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        let mut state = lock(&self.state);
        if state.boot != self.boot {
            return Err(io::Error::other(
                "the disk lost power since the file was opened",
            ));
        }
        let inode = state
            .inodes
            .get_mut(&self.id)
            .expect("an open inode exists");
        Ok(op(inode))
    }

    /// [`with`](Self::with) for an operation that changes the file (see [`State::change`]).
    fn with_change<T>(&self, op: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        {
            let mut state = lock(&self.state);
            if state.boot == self.boot {
                state.change()?;
            }
        }
        self.with(op)
    }
}

impl DiskFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.with(|inode| inode.now.read(buf, offset))
    }

    fn read_cached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at(buf, offset)
    }

    fn advise_will_need(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut state = lock(&self.state);
        if state.advice.len() == ADVICE_KEPT_MAX {
            state.advice.drain(..ADVICE_KEPT_MAX / 2);
        }
        state.advice.push((self.id, offset, len));
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        offset
            .checked_add(buf.len() as u64)
            .ok_or(ErrorKind::InvalidInput)?;
        self.with_change(|inode| {
            inode.now.write(buf, offset);
            inode.pending.push(Change::Write {
                offset,
                bytes: buf.to_vec(),
            });
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_change(|inode| {
            inode.now.set_len(len);
            inode.pending.push(Change::SetLen(len));
        })
    }

    fn size(&self) -> io::Result<u64> {
        self.with(|inode| inode.now.len)
    }

    fn sync_data(&self) -> io::Result<()> {
        let wait = {
            let mut state = lock(&self.state);
            state.file_syncs += 1;
            state.file_syncs_now += 1;
            state.file_syncs_at_once_max = state.file_syncs_at_once_max.max(state.file_syncs_now);
            state.file_sync_wait
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        lock(&self.state).file_syncs_now -= 1;
        self.with_change(|inode| {
            for change in std::mem::take(&mut inode.pending) {
                inode.durable.apply(&change);
            }
        })
    }

    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.with(|inode| inode.now.next_data(offset))
    }

    fn next_hole(&self, offset: u64) -> io::Result<u64> {
        self.with(|inode| inode.now.next_hole(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(disk: &MemDisk, path: &str) -> Option<Vec<u8>> {
        crate::disk::read_file(disk, Path::new(path)).ok()
    }

    /// A disk with `/d` durable, and `/d/f` holding `old` durably.
    fn with_file(old: &[u8]) -> (MemDisk, FileHandle) {
        let disk = MemDisk::new();
        disk.create_dir_all(Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        let file = disk.open(Path::new("/d/f")).unwrap();
        file.write_all_at(old, 0).unwrap();
        file.sync_data().unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        (disk, file)
    }

    #[test]
    fn synced_bytes_survive_a_crash_and_unsynced_ones_do_not() {
        let (disk, file) = with_file(b"durable");
        file.write_all_at(b"VOLATILE", 3).unwrap();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"durVOLATILE");
        let report = disk.crash();
        assert_eq!(report.writes_dropped, 1);
        assert_eq!(read(&disk, "/d/f").unwrap(), b"durable");
        // The old handle died with the power.
        assert!(file.read_at(&mut [0u8; 4], 0).is_err());
        assert_eq!(disk.unsynced_changes(), 0);
    }

    #[test]
    fn names_are_durable_only_once_their_directory_is_synced() {
        let (disk, _) = with_file(b"old");
        let new = disk.create(Path::new("/d/f.new")).unwrap();
        new.write_all_at(b"new", 0).unwrap();
        new.sync_data().unwrap();
        disk.rename(Path::new("/d/f.new"), Path::new("/d/f"))
            .unwrap();
        disk.create_dir(Path::new("/d/sub")).unwrap();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"new");
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
        assert_eq!(disk.kind(Path::new("/d/sub")).unwrap(), None);
        assert_eq!(disk.kind(Path::new("/d/f.new")).unwrap(), None);

        let new = disk.create(Path::new("/d/f.new")).unwrap();
        new.write_all_at(b"new", 0).unwrap();
        new.sync_data().unwrap();
        disk.rename(Path::new("/d/f.new"), Path::new("/d/f"))
            .unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"new");
        assert_eq!(
            disk.read_dir(Path::new("/d")).unwrap(),
            vec!["f".to_string()]
        );
    }

    #[test]
    fn a_directory_removed_and_made_again_loses_its_old_durable_entries() {
        let (disk, _) = with_file(b"old");
        disk.remove_dir_all(Path::new("/d")).unwrap();
        disk.create_dir(Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.crash();
        assert_eq!(disk.kind(Path::new("/d")).unwrap(), Some(EntryKind::Dir));
        assert_eq!(read(&disk, "/d/f"), None);
        // Removed without a sync: back after the power loss.
        let (disk, _) = with_file(b"old");
        disk.remove_dir_all(Path::new("/d")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
    }

    /// A directory renamed takes what it durably holds to its new name once the new name is
    /// durable; before either directory is synced, a power loss puts it back under the old.
    #[test]
    fn a_renamed_directory_keeps_its_durable_contents_under_the_new_name() {
        let (disk, _) = with_file(b"old");
        disk.create_dir(Path::new("/k")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.rename(Path::new("/d"), Path::new("/k/d")).unwrap();
        assert_eq!(read(&disk, "/k/d/f").unwrap(), b"old");
        assert_eq!(read(&disk, "/d/f"), None);
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
        assert_eq!(read(&disk, "/k/d/f"), None);

        disk.rename(Path::new("/d"), Path::new("/k/d")).unwrap();
        // The new name first: under both names until the old one's directory is synced.
        disk.sync_dir(Path::new("/k")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/k/d/f").unwrap(), b"old");
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
        disk.remove_dir_all(Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/k/d/f").unwrap(), b"old");
        assert_eq!(disk.kind(Path::new("/d")).unwrap(), None);
        // Onto a name that exists, or into itself: refused.
        disk.create_dir(Path::new("/e")).unwrap();
        assert!(disk.rename(Path::new("/e"), Path::new("/k/d")).is_err());
        assert!(disk.rename(Path::new("/k"), Path::new("/k/d/x")).is_err());
    }

    /// [`with_file`]'s `/d` moved to `/k/d` as a store's renewal keeps a file, durably.
    fn kept_aside() -> MemDisk {
        let (disk, _) = with_file(b"old");
        disk.create_dir(Path::new("/k")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.rename(Path::new("/d"), Path::new("/k/d")).unwrap();
        disk.sync_dir(Path::new("/k")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk
    }

    /// Kept and put back, as a store's renewal and a rebuild's restore do.
    #[test]
    fn a_directory_renamed_away_and_back_keeps_its_durable_contents() {
        let disk = kept_aside();
        disk.crash();
        assert_eq!(read(&disk, "/k/d/f").unwrap(), b"old");
        disk.rename(Path::new("/k/d"), Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.sync_dir(Path::new("/k")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
        assert_eq!(read(&disk, "/k/d/f"), None);
    }

    /// Put back under a name a directory made since had durably (a restore over the renewed
    /// store's own directory of the file): the put-back contents are what is durable.
    #[test]
    fn a_directory_renamed_over_a_removed_durable_one_keeps_its_own_contents() {
        let disk = kept_aside();
        // A new /d, durable with a file of its own.
        disk.create_dir(Path::new("/d")).unwrap();
        let other = disk.create(Path::new("/d/g")).unwrap();
        other.sync_data().unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.remove_dir_all(Path::new("/d")).unwrap();
        disk.rename(Path::new("/k/d"), Path::new("/d")).unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.sync_dir(Path::new("/k")).unwrap();
        disk.crash();
        assert_eq!(read(&disk, "/d/f").unwrap(), b"old");
        assert_eq!(disk.kind(Path::new("/d/g")).unwrap(), None);
    }

    /// Over many seeds a power loss keeps, drops and tears writes, and every sector reads as
    /// the old bytes or the new, never anything else.
    #[test]
    fn a_power_loss_keeps_drops_or_tears_each_write_at_sector_boundaries() {
        let old = vec![0xaa; 4096];
        let mut seen = PowerLoss::default();
        for seed in 0..200 {
            let (disk, file) = with_file(&old);
            file.write_all_at(&[0x55; 2000], 100).unwrap();
            file.write_all_at(&[0x77; 600], 4000).unwrap();
            let report = disk.power_loss(seed);
            seen.writes_kept += report.writes_kept;
            seen.writes_dropped += report.writes_dropped;
            seen.writes_torn += report.writes_torn;
            let bytes = read(&disk, "/d/f").unwrap();
            assert!(bytes.len() == 4096 || bytes.len() == 4600, "seed {seed}");
            for (sector, chunk) in bytes.chunks(SECTOR_BYTES as usize).enumerate() {
                let start = sector as u64 * SECTOR_BYTES;
                for (i, &byte) in chunk.iter().enumerate() {
                    let at = start + i as u64;
                    let allowed: &[u8] = match at {
                        100..=2099 => &[0xaa, 0x55],
                        4000..=4095 => &[0xaa, 0x77],
                        4096.. => &[0x00, 0x77],
                        _ => &[0xaa],
                    };
                    assert!(allowed.contains(&byte), "seed {seed} byte {at}: {byte:#x}");
                }
                // A sector wholly inside the first write is all old or all new.
                let first = chunk[0];
                if start >= 512 && start + 512 <= 2048 {
                    assert!(
                        chunk.iter().all(|&b| b == first),
                        "seed {seed} sector {sector}"
                    );
                }
            }
        }
        assert!(seen.writes_kept > 0 && seen.writes_dropped > 0 && seen.writes_torn > 0);
    }

    #[test]
    fn a_dropped_truncation_drops_what_followed_it() {
        let mut outcomes = HashSet::new();
        for seed in 0..50 {
            let (disk, file) = with_file(&[1u8; 100]);
            file.set_len(0).unwrap();
            file.write_all_at(b"header", 0).unwrap();
            disk.power_loss(seed);
            let bytes = read(&disk, "/d/f").unwrap();
            // Never the new header over the old bytes.
            assert!(
                bytes.len() != 100 || bytes == [1u8; 100],
                "seed {seed}: {bytes:?}"
            );
            outcomes.insert(bytes.len());
        }
        assert!(
            outcomes.contains(&100) && outcomes.contains(&0),
            "{outcomes:?}"
        );
    }

    #[test]
    fn a_bit_flip_changes_one_bit_durably() {
        let (disk, _) = with_file(&[0u8; 1000]);
        let flip = disk.flip_bit(Path::new("/d"), 7).unwrap();
        assert_eq!(flip.path, Path::new("/d/f"));
        disk.crash();
        let bytes = read(&disk, "/d/f").unwrap();
        let ones: u32 = bytes.iter().map(|b| b.count_ones()).sum();
        assert_eq!(ones, 1);
        assert_eq!(bytes[flip.offset as usize], 1 << flip.bit);
        assert_eq!(disk.flip_bit(Path::new("/empty"), 7), None);
    }

    #[test]
    fn holes_are_skipped_and_locks_are_exclusive() {
        let (disk, file) = with_file(b"");
        file.write_all_at(b"x", 3 * PAGE_BYTES + 5).unwrap();
        file.write_all_at(b"y", 10 * PAGE_BYTES).unwrap();
        assert_eq!(file.next_data(0).unwrap(), Some(3 * PAGE_BYTES));
        assert_eq!(file.next_hole(3 * PAGE_BYTES).unwrap(), 4 * PAGE_BYTES);
        assert_eq!(
            file.next_data(4 * PAGE_BYTES).unwrap(),
            Some(10 * PAGE_BYTES)
        );
        assert_eq!(
            file.next_hole(10 * PAGE_BYTES).unwrap(),
            10 * PAGE_BYTES + 1
        );
        file.set_len(5 * PAGE_BYTES).unwrap();
        assert_eq!(file.next_data(4 * PAGE_BYTES).unwrap(), None);
        let held = disk.lock(Path::new("/d/lock")).unwrap();
        let again = disk.lock(Path::new("/d/lock")).map(drop);
        assert_eq!(again.unwrap_err().kind(), ErrorKind::WouldBlock);
        drop(held);
        disk.lock(Path::new("/d/lock")).unwrap();
    }
}
