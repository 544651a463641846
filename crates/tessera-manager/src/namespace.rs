//! The directory tree over the flat namespace (see `tessera_wire::NamespaceRequest`).
//!
//! Five tables beside `paths`:
//!
//! ```text
//! dirs:                 &str   -> ()          directories made explicitly (an empty one exists only here)
//! times:                FileId -> u64         a file's modification time, ns since the Unix epoch, as its writer sent it
//! dir_times:            &str   -> u64         a directory's modification time, the same way (`TouchDir`)
//! access_change:        FileId -> (atime, ctime)  a file's access and change times (`Option<u64>` each)
//! dir_access_change:    &str   -> (atime, ctime)  a directory's, the same way
//! ```
//!
//! A modification is a change: `Touch` and `TouchDir` set the change time to the
//! modification time they record; `SetTimes` sets whichever times it gives. The access and
//! change times were added beside the older modification tables (rather than widening
//! their values) so that a store written before them opens as it is.
//!
//! A directory's times move with it in a rename and go with it in a `RemoveDir`. One that
//! vanishes because its last file went (it was never made) keeps its time until the path is
//! a directory again and touched; the mount touches a directory at each change of its
//! entries, so only a directory filled and emptied by other clients shows such a time.
//!
//! A directory `d` exists if `dirs` holds it or if any key of `paths` or `dirs` starts with
//! `d/`: both tables sort bytewise, so that is one range probe each. A rename of a directory
//! moves every key below it in the one write transaction of the request, so it is atomic and,
//! ordered like every change, replicates as one command.

use super::{check_path, Change, Manager};
use crate::store::{self, Failure};
use redb::{ReadableTable, TableDefinition};
use tessera_wire::{
    parent_of, DirListing, FileId, FileMeta, ManagerError, ManagerResponse, NamespaceEntry,
    NamespaceRequest, Times, TimesOf,
};

pub(crate) const DIRS: TableDefinition<&str, ()> = TableDefinition::new("dirs");
pub(crate) const TIMES: TableDefinition<FileId, u64> = TableDefinition::new("times");
pub(crate) const DIR_TIMES: TableDefinition<&str, u64> = TableDefinition::new("dir_times");
/// Access and change times of a file or directory: (accessed, changed).
pub(crate) type AccessChange = (Option<u64>, Option<u64>);
pub(crate) const ACCESS_CHANGE: TableDefinition<FileId, AccessChange> =
    TableDefinition::new("access_change");
pub(crate) const DIR_ACCESS_CHANGE: TableDefinition<&str, AccessChange> =
    TableDefinition::new("dir_access_change");

/// Entries one listing returns at most: a larger directory is refused rather than sent in
/// a frame the transports would refuse.
pub const DIR_ENTRIES_MAX: usize = 100_000;

impl Manager {
    /// Answers one request about the directory tree.
    pub(crate) fn namespace(
        &mut self,
        request: NamespaceRequest,
    ) -> Result<ManagerResponse, Failure> {
        match request {
            NamespaceRequest::MakeDir { path } => {
                check_path(&path)?;
                self.write(|change| make_dir(change, &path))?;
            }
            NamespaceRequest::RemoveDir { path } => {
                self.write(|change| remove_dir(change, &path))?;
            }
            NamespaceRequest::Rename { from, to } => {
                check_path(&from)?;
                check_path(&to)?;
                self.write(|change| rename(change, &from, &to))?;
            }
            NamespaceRequest::ListDir { path } => return self.list_dir(&path),
            NamespaceRequest::Entry { path } => return self.entry(&path),
            NamespaceRequest::Touch { file, modified } => {
                self.write(|change| set_file_times(change, file, &Times::modified_at(modified)))?;
            }
            NamespaceRequest::TouchDir { path, modified } => {
                self.write(|change| set_dir_times(change, &path, &Times::modified_at(modified)))?;
            }
            NamespaceRequest::SetTimes { of, times } => {
                self.write(|change| set_times(change, of, &times))?;
            }
        }
        Ok(ManagerResponse::Done)
    }

    fn entry(&self, path: &str) -> Result<ManagerResponse, Failure> {
        let txn = self.read_txn()?;
        let paths = txn.open_table(store::PATHS)?;
        let dirs = open_read(&txn, DIRS)?;
        if let Some(file) = paths.get(path)?.map(|id| id.value()) {
            let meta = store::read_file(&txn.open_table(store::FILES)?, file)?
                .ok_or_else(|| ManagerError::Store(format!("path {path} names a missing file")))?;
            let times = entry_times(&txn, TIMES, ACCESS_CHANGE, file)?;
            return Ok(ManagerResponse::Entry(Some(NamespaceEntry::File {
                meta,
                times,
            })));
        }
        if !(path.is_empty() || dir_exists(&paths, dirs.as_ref(), path)?) {
            return Ok(ManagerResponse::Entry(None));
        }
        let times = entry_times(&txn, DIR_TIMES, DIR_ACCESS_CHANGE, path)?;
        Ok(ManagerResponse::Entry(Some(NamespaceEntry::Dir { times })))
    }

    fn list_dir(&self, path: &str) -> Result<ManagerResponse, Failure> {
        let txn = self.read_txn()?;
        let paths = txn.open_table(store::PATHS)?;
        let files = txn.open_table(store::FILES)?;
        let dirs = open_read(&txn, DIRS)?;
        let times = open_read(&txn, TIMES)?;
        if !path.is_empty() && !dir_exists(&paths, dirs.as_ref(), path)? {
            return Err(match paths.get(path)? {
                Some(_) => ManagerError::NotDir(path.to_string()),
                None => ManagerError::NotFound(path.to_string()),
            }
            .into());
        }
        let prefix = dir_prefix(path);
        let mut listing = DirListing::default();
        let mut subdirs = std::collections::BTreeSet::new();
        for entry in paths.range(prefix.as_str()..)? {
            let (key, file) = entry?;
            let Some(rest) = key.value().strip_prefix(prefix.as_str()) else {
                break;
            };
            match rest.split_once('/') {
                Some((dir, _)) => {
                    subdirs.insert(dir.to_string());
                }
                None => {
                    let meta = store::read_file(&files, file.value())?.ok_or_else(|| {
                        ManagerError::Store(format!("path {} names a missing file", key.value()))
                    })?;
                    let modified = read_time(times.as_ref(), meta.id)?;
                    listing.files.push((meta, modified));
                }
            }
            check_listed(path, listing.files.len() + subdirs.len())?;
        }
        if let Some(dirs) = &dirs {
            for entry in dirs.range(prefix.as_str()..)? {
                let (key, _) = entry?;
                let Some(rest) = key.value().strip_prefix(prefix.as_str()) else {
                    break;
                };
                subdirs.insert(rest.split('/').next().unwrap_or(rest).to_string());
                check_listed(path, listing.files.len() + subdirs.len())?;
            }
        }
        listing.dirs = subdirs.into_iter().collect();
        Ok(ManagerResponse::Dir(listing))
    }
}

fn check_listed(path: &str, entries: usize) -> Result<(), Failure> {
    if entries > DIR_ENTRIES_MAX {
        return Err(ManagerError::Layout(format!(
            "directory '{path}' has more than {DIR_ENTRIES_MAX} entries; list it by prefix"
        ))
        .into());
    }
    Ok(())
}

/// Keys below directory `path` start with this (`""` for the root).
fn dir_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    }
}

/// Opens a table for reading; `None` if no change ever created it.
fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, Failure> {
    match txn.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(Failure::Store(error.into())),
    }
}

/// The times recorded for `key` in a modification table and an access-and-change table.
fn entry_times<'k, K: redb::Key + 'static>(
    txn: &redb::ReadTransaction,
    modified: TableDefinition<K, u64>,
    access_change: TableDefinition<K, AccessChange>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
) -> Result<Times, Failure> {
    let modified = match open_read(txn, modified)? {
        Some(table) => table.get(key.borrow())?.map(|time| time.value()),
        None => None,
    };
    let (accessed, changed) = match open_read(txn, access_change)? {
        Some(table) => table.get(key.borrow())?.map_or((None, None), |t| t.value()),
        None => (None, None),
    };
    Ok(Times {
        accessed,
        modified,
        changed,
    })
}

fn read_time(
    times: Option<&impl ReadableTable<FileId, u64>>,
    file: FileId,
) -> Result<Option<u64>, Failure> {
    match times {
        Some(times) => Ok(times.get(file)?.map(|time| time.value())),
        None => Ok(None),
    }
}

/// Whether any key of `table` lies below directory `path`.
fn has_below<V: redb::Value + 'static>(
    table: &impl ReadableTable<&'static str, V>,
    path: &str,
) -> Result<bool, Failure> {
    let prefix = dir_prefix(path);
    match table.range(prefix.as_str()..)?.next() {
        Some(entry) => Ok(entry?.0.value().starts_with(prefix.as_str())),
        None => Ok(false),
    }
}

/// Whether `path` is a directory: made, or with a file or made directory below it.
fn dir_exists(
    paths: &impl ReadableTable<&'static str, FileId>,
    dirs: Option<&impl ReadableTable<&'static str, ()>>,
    path: &str,
) -> Result<bool, Failure> {
    if let Some(dirs) = dirs {
        if dirs.get(path)?.is_some() || has_below(dirs, path)? {
            return Ok(true);
        }
    }
    has_below(paths, path)
}

/// Refuses to give a file `path` where the tree cannot hold it: a directory is there
/// (`IsDir`), or a file holds the place of one of its directories (`NotDir`). Without this,
/// `a` and `a/x` could both be files, which a mount lists as two entries of one name.
pub(crate) fn check_file_path(change: &Change<'_>, path: &str) -> Result<(), Failure> {
    let dirs = change.txn.open_table(DIRS)?;
    if dir_exists(&change.tables.paths, Some(&dirs), path)? {
        return Err(ManagerError::IsDir(path.to_string()).into());
    }
    let mut at = path;
    while let Some((parent, _)) = at.rsplit_once('/') {
        if change.file_id(parent)?.is_some() {
            return Err(ManagerError::NotDir(parent.to_string()).into());
        }
        at = parent;
    }
    Ok(())
}

/// What `path` names inside a write transaction: `Some(Some(file))`, `Some(None)` for a
/// directory, `None` for nothing. The root is a directory.
fn kind_in(
    change: &Change<'_>,
    dirs: &redb::Table<'_, &'static str, ()>,
    path: &str,
) -> Result<Option<Option<FileId>>, Failure> {
    if let Some(file) = change.file_id(path)? {
        return Ok(Some(Some(file)));
    }
    let is_dir = path.is_empty() || dir_exists(&change.tables.paths, Some(dirs), path)?;
    Ok(is_dir.then_some(None))
}

/// Refuses unless `path`'s parent is a directory.
fn check_parent(
    change: &Change<'_>,
    dirs: &redb::Table<'_, &'static str, ()>,
    path: &str,
) -> Result<(), Failure> {
    let parent = parent_of(path);
    match kind_in(change, dirs, parent)? {
        Some(None) => Ok(()),
        Some(Some(_)) => Err(ManagerError::NotDir(parent.to_string()).into()),
        None => Err(ManagerError::NotFound(parent.to_string()).into()),
    }
}

fn make_dir(change: &mut Change<'_>, path: &str) -> Result<(), Failure> {
    let mut dirs = change.txn.open_table(DIRS)?;
    if kind_in(change, &dirs, path)?.is_some() {
        return Err(ManagerError::Exists(path.to_string()).into());
    }
    check_parent(change, &dirs, path)?;
    dirs.insert(path, ())?;
    Ok(())
}

fn remove_dir(change: &mut Change<'_>, path: &str) -> Result<(), Failure> {
    let mut dirs = change.txn.open_table(DIRS)?;
    match kind_in(change, &dirs, path)? {
        None => return Err(ManagerError::NotFound(path.to_string()).into()),
        Some(Some(_)) => return Err(ManagerError::NotDir(path.to_string()).into()),
        Some(None) if path.is_empty() => {
            return Err(ManagerError::Layout("the root cannot be removed".into()).into())
        }
        Some(None) => {}
    }
    if has_below(&change.tables.paths, path)? || has_below(&dirs, path)? {
        return Err(ManagerError::NotEmpty(path.to_string()).into());
    }
    dirs.remove(path)?;
    change.txn.open_table(DIR_TIMES)?.remove(path)?;
    change.txn.open_table(DIR_ACCESS_CHANGE)?.remove(path)?;
    Ok(())
}

/// Records the times given of what `of` names.
fn set_times(change: &mut Change<'_>, of: TimesOf, times: &Times) -> Result<(), Failure> {
    match of {
        TimesOf::File(file) => set_file_times(change, file, times),
        TimesOf::Path(path) => {
            let dirs = change.txn.open_table(DIRS)?;
            let kind = kind_in(change, &dirs, &path)?;
            drop(dirs);
            match kind {
                Some(Some(file)) => set_file_times(change, file, times),
                Some(None) => set_dir_times(change, &path, times),
                None => Err(ManagerError::NotFound(path).into()),
            }
        }
    }
}

/// Records the times given of file `file`; refused if there is no such file.
fn set_file_times(change: &mut Change<'_>, file: FileId, times: &Times) -> Result<(), Failure> {
    if store::read_file(&change.tables.files, file)?.is_none() {
        return Err(ManagerError::NotFound(file.to_string()).into());
    }
    if let Some(modified) = times.modified {
        change.txn.open_table(TIMES)?.insert(file, modified)?;
    }
    merge_access_change(&mut change.txn.open_table(ACCESS_CHANGE)?, file, times)
}

/// Records the times given of directory `path`; refused if it is not a directory.
fn set_dir_times(change: &mut Change<'_>, path: &str, times: &Times) -> Result<(), Failure> {
    let dirs = change.txn.open_table(DIRS)?;
    match kind_in(change, &dirs, path)? {
        Some(None) => {}
        Some(Some(_)) => return Err(ManagerError::NotDir(path.to_string()).into()),
        None => return Err(ManagerError::NotFound(path.to_string()).into()),
    }
    if let Some(modified) = times.modified {
        change.txn.open_table(DIR_TIMES)?.insert(path, modified)?;
    }
    merge_access_change(&mut change.txn.open_table(DIR_ACCESS_CHANGE)?, path, times)
}

/// Replaces the access and change times of `key` that `times` gives, keeping the others.
fn merge_access_change<'k, K: redb::Key + 'static>(
    table: &mut redb::Table<'_, K, AccessChange>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    times: &Times,
) -> Result<(), Failure> {
    if times.accessed.is_none() && times.changed.is_none() {
        return Ok(());
    }
    let (accessed, changed) = table.get(key.borrow())?.map_or((None, None), |t| t.value());
    let merged = (times.accessed.or(accessed), times.changed.or(changed));
    table.insert(key.borrow(), merged)?;
    Ok(())
}

fn rename(change: &mut Change<'_>, from: &str, to: &str) -> Result<(), Failure> {
    let mut dirs = change.txn.open_table(DIRS)?;
    let source =
        kind_in(change, &dirs, from)?.ok_or_else(|| ManagerError::NotFound(from.to_string()))?;
    if from == to {
        return Ok(());
    }
    check_parent(change, &dirs, to)?;
    let target = kind_in(change, &dirs, to)?;
    match (source, target) {
        (Some(_), Some(None)) => Err(ManagerError::IsDir(to.to_string()).into()),
        (None, Some(Some(_))) => Err(ManagerError::NotDir(to.to_string()).into()),
        (Some(file), target) => {
            if let Some(Some(old)) = target {
                if let Some(old) = store::read_file(&change.tables.files, old)? {
                    change.remove_file(&old)?;
                }
            }
            move_file(change, file, to)
        }
        (None, target) => {
            if to.starts_with(&dir_prefix(from)) {
                return Err(ManagerError::Layout(format!(
                    "cannot move directory '{from}' into itself ('{to}')"
                ))
                .into());
            }
            if target.is_some() {
                if has_below(&change.tables.paths, to)? || has_below(&dirs, to)? {
                    return Err(ManagerError::NotEmpty(to.to_string()).into());
                }
                dirs.remove(to)?;
                change.txn.open_table(DIR_TIMES)?.remove(to)?;
                change.txn.open_table(DIR_ACCESS_CHANGE)?.remove(to)?;
            }
            move_dir(change, &mut dirs, from, to)?;
            move_dir_times(&mut change.txn.open_table(DIR_TIMES)?, from, to)?;
            move_dir_times(&mut change.txn.open_table(DIR_ACCESS_CHANGE)?, from, to)
        }
    }
}

/// Points `to` at `file` and drops its old path, in its record too.
fn move_file(change: &mut Change<'_>, file: FileId, to: &str) -> Result<(), Failure> {
    let mut meta: FileMeta = store::read_file(&change.tables.files, file)?
        .ok_or_else(|| ManagerError::Store(format!("file {file} has no record")))?;
    change.tables.paths.remove(meta.path.as_str())?;
    meta.path = to.to_string();
    change.put_file(&meta)
}

/// Moves every file and made directory below `from` (and `from` itself) to below `to`.
fn move_dir(
    change: &mut Change<'_>,
    dirs: &mut redb::Table<'_, &'static str, ()>,
    from: &str,
    to: &str,
) -> Result<(), Failure> {
    let prefix = dir_prefix(from);
    let renamed = |key: &str| format!("{to}/{}", &key[prefix.len()..]);
    let mut files = Vec::new();
    for entry in change.tables.paths.range(prefix.as_str()..)? {
        let (key, file) = entry?;
        if !key.value().starts_with(prefix.as_str()) {
            break;
        }
        files.push(file.value());
    }
    for file in files {
        let path = store::read_file(&change.tables.files, file)?
            .ok_or_else(|| ManagerError::Store(format!("file {file} has no record")))?
            .path;
        // A longer new name can push a path below it past the limit: refuse the rename.
        let path = renamed(&path);
        check_path(&path)?;
        move_file(change, file, &path)?;
    }
    let mut made = Vec::new();
    for entry in dirs.range(prefix.as_str()..)? {
        let (key, _) = entry?;
        if !key.value().starts_with(prefix.as_str()) {
            break;
        }
        made.push(key.value().to_string());
    }
    for dir in made {
        check_path(&renamed(&dir))?;
        dirs.remove(dir.as_str())?;
        dirs.insert(renamed(&dir).as_str(), ())?;
    }
    // The moved directory stays a directory at its new path even if it was empty.
    dirs.remove(from)?;
    dirs.insert(to, ())?;
    Ok(())
}

/// Moves the times of directory `from` and of every directory below it to `to`, in one of
/// the directory time tables.
fn move_dir_times<V>(
    times: &mut redb::Table<'_, &'static str, V>,
    from: &str,
    to: &str,
) -> Result<(), Failure>
where
    V: for<'a> redb::Value<SelfType<'a> = V> + 'static,
{
    let prefix = dir_prefix(from);
    let mut moved = Vec::new();
    if let Some(time) = times.remove(from)? {
        moved.push((to.to_string(), time.value()));
    }
    let mut below = Vec::new();
    for entry in times.range(prefix.as_str()..)? {
        let (key, time) = entry?;
        let Some(rest) = key.value().strip_prefix(prefix.as_str()) else {
            break;
        };
        below.push((
            key.value().to_string(),
            format!("{to}/{rest}"),
            time.value(),
        ));
    }
    for (old, new, time) in below {
        times.remove(old.as_str())?;
        moved.push((new, time));
    }
    for (path, time) in moved {
        times.insert(path.as_str(), time)?;
    }
    Ok(())
}
