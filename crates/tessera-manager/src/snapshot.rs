//! Snapshots of files as manager state (issue 17, item 5).
//!
//! A snapshot is a name, an epoch and its files' metadata as they stood when it was taken;
//! its bytes stay on the storage servers, which copy a block aside before its first
//! overwrite after the snapshot began there (`tessera-store`'s `snapshot` module has the
//! design). Taking, readying and removing one are ordinary requests, so a replicated manager
//! orders them like every other change and every replica holds the same snapshots; nothing
//! here reads a clock or draws a number (the epoch is a counter in the store).
//!
//! Tables (added to format version 1 compatibly: created when missing, a store without them
//! has no snapshots):
//!
//! ```text
//! snapshots:      &str               -> (version u8, SnapshotInfo), postcard
//! snapshot_files: (FileId, epoch)    -> ()      which snapshots hold which file
//! retained:       FileId             -> ()      files removed from the namespace that
//!                                               snapshots still hold (kept in `files`,
//!                                               with their debts, so rebuild covers them)
//! meta["snapshot_epoch_next"]                   the next epoch (from 1)
//! ```
//!
//! **A snapshot never made ready expires.** Its taker died between `SnapshotCreate` and
//! `SnapshotReady` (or froze there): the record would hold its name, and its files past their
//! removal, for good. A single manager keeps, in memory, the end of a lease per snapshot not
//! ready ([`SNAPSHOT_READY_LEASE_DEFAULT`] from its creation, or from the first tick after
//! open), and its tick removes the snapshot when it ends, as `SnapshotRemove` does (files only
//! it held are freed as orphans). A taker's `SnapshotReady` after that is refused
//! (`NotFound`), so its creation fails rather than naming a snapshot that is gone; the lease is
//! far above the taker's own bound (every begin within 2.4 s of its first fence). The servers'
//! fences of that snapshot lapse by themselves (3 s); the copies they made for its epoch stay
//! until the file is removed or a later snapshot's removal sweeps them (as after a
//! `snapshot rm`), and the epoch stays begun there (correct for older snapshots, which read the
//! copies of the smallest epoch at or above their own). A replicated manager does not expire
//! them yet: that needs an ordered command, as pending files have (`command.rs`).

use crate::manager::Change;
use crate::store::{self, Failure};
use crate::Manager;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tessera_wire::{
    FileId, FileMeta, ManagerError, ManagerResponse, MissedStripes, SnapshotFile, SnapshotInfo,
};

pub(crate) const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
pub(crate) const SNAPSHOT_FILES: TableDefinition<(FileId, u64), ()> =
    TableDefinition::new("snapshot_files");
pub(crate) const RETAINED: TableDefinition<FileId, ()> = TableDefinition::new("retained");
const KEY_SNAPSHOT_EPOCH_NEXT: &str = "snapshot_epoch_next";
/// Version of a `snapshots` record.
const SNAPSHOT_RECORD_VERSION: u8 = 1;
/// Longest snapshot name, in bytes.
pub const SNAPSHOT_NAME_BYTES_MAX: usize = 255;
/// Most files one snapshot holds: its record is one value in the store and one answer.
pub const SNAPSHOT_FILES_MAX: usize = 16_384;
/// Default time a snapshot may stay created and not ready before it is removed.
pub const SNAPSHOT_READY_LEASE_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);

/// The names of the snapshots not ready in the store (their leases start at the first tick).
pub(crate) fn load_incomplete(db: &redb::Database) -> Result<Vec<String>, Failure> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(SNAPSHOTS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(error) => return Err(Failure::Store(error.into())),
    };
    let mut names = Vec::new();
    for entry in table.iter()? {
        let (name, record) = entry?;
        if !decode(record.value())?.ready {
            names.push(name.value().to_string());
        }
    }
    Ok(names)
}

fn encode(info: &SnapshotInfo) -> Result<Vec<u8>, Failure> {
    Ok(postcard::to_allocvec(&(SNAPSHOT_RECORD_VERSION, info))?)
}

fn decode(bytes: &[u8]) -> Result<SnapshotInfo, Failure> {
    let (version, info): (u8, SnapshotInfo) = postcard::from_bytes(bytes)?;
    if version != SNAPSHOT_RECORD_VERSION {
        return Err(Failure::UnknownFormat(u64::from(version)));
    }
    Ok(info)
}

fn check_name(name: &str) -> Result<(), Failure> {
    let problem = if name.is_empty() {
        "snapshot name is empty"
    } else if name.len() > SNAPSHOT_NAME_BYTES_MAX {
        "snapshot name is longer than 255 bytes"
    } else if name.chars().any(char::is_control) {
        "snapshot name contains a control character"
    } else {
        return Ok(());
    };
    Err(ManagerError::Layout(problem.to_string()).into())
}

/// The snapshot called `name` in `change`, if any.
fn read(change: &Change<'_>, name: &str) -> Result<Option<SnapshotInfo>, Failure> {
    let table = change.txn.open_table(SNAPSHOTS)?;
    let record = table.get(name)?;
    record.map(|bytes| decode(bytes.value())).transpose()
}

fn put(change: &Change<'_>, info: &SnapshotInfo) -> Result<(), Failure> {
    let mut table = change.txn.open_table(SNAPSHOTS)?;
    table.insert(info.name.as_str(), encode(info)?.as_slice())?;
    Ok(())
}

/// The epochs of the snapshots that hold `file`.
fn epochs_of(change: &Change<'_>, file: FileId) -> Result<Vec<u64>, Failure> {
    let table = change.txn.open_table(SNAPSHOT_FILES)?;
    let mut epochs = Vec::new();
    for entry in table.range((file, 0)..=(file, u64::MAX))? {
        epochs.push(entry?.0.value().1);
    }
    Ok(epochs)
}

impl Change<'_> {
    /// Whether snapshots hold `file`: then its removal from the namespace keeps its data (and
    /// its record, and what its servers owe of it), and it is recorded as retained.
    pub(crate) fn retain_if_held(&mut self, meta: &FileMeta) -> Result<bool, Failure> {
        if epochs_of(self, meta.id)?.is_empty() {
            return Ok(false);
        }
        self.txn.open_table(RETAINED)?.insert(meta.id, ())?;
        Ok(true)
    }
}

impl Manager {
    pub(crate) fn snapshot_create(
        &mut self,
        name: String,
        prefix: String,
        now: std::time::Instant,
    ) -> Result<ManagerResponse, Failure> {
        check_name(&name)?;
        let info = self.write(|change| {
            if read(change, &name)?.is_some() {
                return Err(ManagerError::Exists(format!("snapshot {name}")).into());
            }
            let epoch = change
                .tables
                .meta
                .get(KEY_SNAPSHOT_EPOCH_NEXT)?
                .map_or(1, |next| next.value());
            change
                .tables
                .meta
                .insert(KEY_SNAPSHOT_EPOCH_NEXT, epoch + 1)?;
            let files = files_under(change, &prefix)?;
            let mut holds = change.txn.open_table(SNAPSHOT_FILES)?;
            for file in &files {
                holds.insert((file.meta.id, epoch), ())?;
            }
            let info = SnapshotInfo {
                name: name.clone(),
                epoch,
                prefix: prefix.clone(),
                ready: false,
                file_count: files.len() as u64,
                bytes: files.iter().map(|f| f.meta.size).sum(),
                files,
            };
            put(change, &info)?;
            Ok(info)
        })?;
        let lease_end = now + self.config.snapshot_ready_lease;
        self.incomplete.insert(info.name.clone(), Some(lease_end));
        Ok(ManagerResponse::Snapshots(vec![info]))
    }

    pub(crate) fn snapshot_ready(&mut self, name: String) -> Result<ManagerResponse, Failure> {
        self.write(|change| {
            let mut info = read(change, &name)?
                .ok_or_else(|| ManagerError::NotFound(format!("snapshot {name}")))?;
            info.ready = true;
            put(change, &info)
        })?;
        self.incomplete.remove(&name);
        Ok(ManagerResponse::Done)
    }

    pub(crate) fn snapshot_list(&self, name: Option<String>) -> Result<ManagerResponse, Failure> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(SNAPSHOTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => match name {
                Some(name) => return Err(ManagerError::NotFound(format!("snapshot {name}")).into()),
                None => return Ok(ManagerResponse::Snapshots(Vec::new())),
            },
            Err(error) => return Err(Failure::Store(error.into())),
        };
        if let Some(name) = name {
            let record = table
                .get(name.as_str())?
                .ok_or_else(|| ManagerError::NotFound(format!("snapshot {name}")))?;
            return Ok(ManagerResponse::Snapshots(vec![decode(record.value())?]));
        }
        let mut all = Vec::new();
        for entry in table.iter()? {
            let mut info = decode(entry?.1.value())?;
            info.files.clear();
            all.push(info);
        }
        all.sort_by_key(|info| info.epoch);
        Ok(ManagerResponse::Snapshots(all))
    }

    pub(crate) fn snapshot_remove(&mut self, name: String) -> Result<ManagerResponse, Failure> {
        let (snapshot, live, freed) = self.write(|change| {
            let info = read(change, &name)?
                .ok_or_else(|| ManagerError::NotFound(format!("snapshot {name}")))?;
            change.txn.open_table(SNAPSHOTS)?.remove(name.as_str())?;
            let mut live = Vec::new();
            let mut freed = Vec::new();
            for file in &info.files {
                let id = file.meta.id;
                change
                    .txn
                    .open_table(SNAPSHOT_FILES)?
                    .remove((id, info.epoch))?;
                let others = epochs_of(change, id)?;
                let retained = change.txn.open_table(RETAINED)?.get(id)?.is_some();
                if retained && others.is_empty() {
                    change.txn.open_table(RETAINED)?.remove(id)?;
                    if let Some(meta) = store::read_file(&change.tables.files, id)? {
                        change.remove_file(&meta)?;
                        freed.push(meta);
                    }
                }
                live.push((id, others));
            }
            Ok((info, live, freed))
        })?;
        self.incomplete.remove(&name);
        Ok(ManagerResponse::SnapshotRemoved {
            snapshot,
            live,
            freed,
        })
    }
}

impl Manager {
    /// Removes every snapshot whose lease to become ready ended at or before `now` (a snapshot
    /// seen for the first time since open gets a whole lease from `now`); one the store
    /// cannot remove now is tried again at the next tick.
    pub(crate) fn expire_snapshots(&mut self, now: std::time::Instant) {
        let lease = self.config.snapshot_ready_lease;
        let mut expired = Vec::new();
        for (name, deadline) in self.incomplete.iter_mut() {
            match deadline {
                None => *deadline = Some(now + lease),
                Some(end) if *end <= now => expired.push(name.clone()),
                Some(_) => {}
            }
        }
        for name in expired {
            match self.snapshot_remove(name.clone()) {
                Ok(_) => tracing::warn!("snapshot {name} was not made ready in time: removed"),
                Err(Failure::Refused(_)) => {
                    self.incomplete.remove(&name);
                }
                Err(_) => {}
            }
        }
    }
}

/// The files named under `prefix` now, with the stripes their servers owe.
fn files_under(change: &Change<'_>, prefix: &str) -> Result<Vec<SnapshotFile>, Failure> {
    let mut files = Vec::new();
    for entry in change.tables.paths.range(prefix..)? {
        let (path, file) = entry?;
        if !path.value().starts_with(prefix) {
            break;
        }
        if files.len() == SNAPSHOT_FILES_MAX {
            return Err(ManagerError::Layout(format!(
                "more than {SNAPSHOT_FILES_MAX} files under {prefix:?}: take snapshots of \
                 narrower prefixes"
            ))
            .into());
        }
        let meta = store::read_file(&change.tables.files, file.value())?.ok_or_else(|| {
            ManagerError::Store(format!("path {} names a missing file", path.value()))
        })?;
        let mut missed = Vec::new();
        for &server in &meta.servers {
            let stripes = store::read_debt(&change.tables.debts, server, meta.id)?;
            if !stripes.is_empty() {
                missed.push(MissedStripes { server, stripes });
            }
        }
        files.push(SnapshotFile { meta, missed });
    }
    Ok(files)
}
