//! Power losses: writes answered but not yet synced when the machine lost power are gone, and
//! the server cannot tell which. So the store keeps two small files under its root:
//!
//! ```text
//! <root>/boot       the disk's boot id (`Disk::boot_id`) when the store last opened, 16 hex
//! <root>/unsynced   present (durably) while some answered write is not yet synced
//! ```
//!
//! The first write after a sync creates `unsynced` (written, synced, directory synced) before
//! it is answered; a sync that leaves nothing owed removes it. At open, a `boot` of another
//! boot than now with `unsynced` present means the machine went down (power loss, kernel
//! crash) while answered writes were not durable: the store takes a new incarnation, which the
//! manager treats as a wiped store (it owes every stripe of every file, and is rebuilt from
//! the others, which hold those writes), and no client reads the old incarnation's bytes. Its
//! bytes are kept aside (`kept.rs`) for when no others are left to rebuild from: then they
//! are put back and parity is resynced from them (md's resync after an unclean shutdown). A
//! process crash keeps the boot: the page cache kept the writes, and the store syncs them at
//! open.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tessera_wire::StorageError;

use crate::disk::{read_file, write_file_synced, Disk};
use crate::io::{disk as disk_error, disk_format};
use crate::meta::sync_dir;

const BOOT_FILE: &str = "boot";
const UNSYNCED_FILE: &str = "unsynced";

/// Whether answered writes may have been lost since the store last ran: the machine booted
/// again since, while `unsynced` was present. Changes nothing: the caller renews the store
/// first, then [`record_boot`]s, so that a crash part-way renews it again at the next open.
pub(crate) fn writes_lost(disk: &dyn Disk, root: &Path) -> Result<bool, StorageError> {
    let (recorded, _) = recorded_boot(disk, root)?;
    // A damaged boot file tells nothing: with writes owed, assume the worst.
    Ok(recorded != Some(disk.boot_id()) && unsynced_present(disk, root)?)
}

/// Records this boot and clears the mark (the caller has synced the file system, and renewed
/// the store if [`writes_lost`], so nothing is owed now).
pub(crate) fn record_boot(disk: &dyn Disk, root: &Path) -> Result<(), StorageError> {
    let boot_path = root.join(BOOT_FILE);
    let (_, bytes) = recorded_boot(disk, root)?;
    let text = format!("{:016x}\n", disk.boot_id());
    // One that still says this boot (a flipped letter's case) is only rewritten.
    let rewrite = bytes.as_deref() != Some(text.as_bytes());
    if rewrite {
        write_file_synced(disk, &boot_path, text.as_bytes())
            .map_err(|error| disk_error(format_args!("write {}", boot_path.display()), error))?;
    }
    let unsynced = unsynced_present(disk, root)?;
    if unsynced {
        let unsynced_path = root.join(UNSYNCED_FILE);
        disk.remove_file(&unsynced_path).map_err(|error| {
            disk_error(format_args!("remove {}", unsynced_path.display()), error)
        })?;
    }
    if rewrite || unsynced {
        sync_dir(disk, root)?;
    }
    Ok(())
}

/// The boot the store last opened in, if its file says one, and the file's bytes.
fn recorded_boot(
    disk: &dyn Disk,
    root: &Path,
) -> Result<(Option<u64>, Option<Vec<u8>>), StorageError> {
    let boot_path = root.join(BOOT_FILE);
    let bytes = match read_file(disk, &boot_path) {
        Ok(bytes) => Some(bytes),
        Err(error) if error.kind() == ErrorKind::NotFound => None,
        Err(error) => {
            let what = format_args!("read {}", boot_path.display());
            return Err(disk_error(what, error));
        }
    };
    let recorded = bytes.as_deref().and_then(|bytes| {
        let text = std::str::from_utf8(bytes).ok()?;
        u64::from_str_radix(text.strip_suffix('\n')?, 16).ok()
    });
    Ok((recorded, bytes))
}

fn unsynced_present(disk: &dyn Disk, root: &Path) -> Result<bool, StorageError> {
    let unsynced_path = root.join(UNSYNCED_FILE);
    let kind = disk
        .kind(&unsynced_path)
        .map_err(|error| disk_error(format_args!("stat {}", unsynced_path.display()), error))?;
    Ok(kind.is_some())
}

/// The `unsynced` mark of an open store.
pub(crate) struct UnsyncedMark {
    path: PathBuf,
    root: PathBuf,
    state: Mutex<MarkState>,
}

#[derive(Default)]
struct MarkState {
    /// The mark is on disk.
    present: bool,
    /// Writes between [`UnsyncedMark::hold`] and the end of their hold: not yet in the set of
    /// files a sync owes, so a sync must not take the mark away under them.
    writes: usize,
}

/// Held by a write from before it changes anything until what it changed is owed a sync.
pub(crate) struct MarkHold<'a>(&'a UnsyncedMark);

impl Drop for MarkHold<'_> {
    fn drop(&mut self) {
        self.0.state().writes -= 1;
    }
}

impl UnsyncedMark {
    /// The mark of a store just opened (absent: [`record_boot`] removed it).
    pub(crate) fn new(root: &Path) -> UnsyncedMark {
        UnsyncedMark {
            path: root.join(UNSYNCED_FILE),
            root: root.to_path_buf(),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MarkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the mark durable, if it is not, before a write changes anything; held until the
    /// write's files are owed a sync.
    ///
    /// The mark is an empty file that counts only by its name (`writes_lost` asks
    /// whether it exists, never reads it), so the root directory's sync is all that makes it
    /// durable: the file has no bytes for an `fdatasync` to write, and its creation is in the
    /// same file-system transaction as its entry (ext4, XFS: one journal transaction per
    /// create). Session 19 dropped that `fdatasync` (0.5-0.9 ms before every first write
    /// after a sync; `power_loss.rs` checks the mark survives with only the directory synced).
    pub(crate) fn hold(&self, disk: &dyn Disk) -> Result<MarkHold<'_>, StorageError> {
        let mut state = self.state();
        if !state.present {
            disk.create(&self.path).map_err(|error| {
                disk_error(format_args!("create {}", self.path.display()), error)
            })?;
            sync_dir(disk, &self.root)?;
            state.present = true;
        }
        state.writes += 1;
        Ok(MarkHold(self))
    }

    /// Holds the mark if it is durable already and its lock is free: what a write that must
    /// not wait for the disk (or for a sync removing the mark) takes; `None` otherwise.
    pub(crate) fn try_hold(&self) -> Option<MarkHold<'_>> {
        let mut state = match self.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if !state.present {
            return None;
        }
        state.writes += 1;
        Some(MarkHold(self))
    }

    /// Removes the mark if no write holds it and `nothing_owed` says every answered write is
    /// durable.
    pub(crate) fn clear_if(
        &self,
        disk: &dyn Disk,
        nothing_owed: impl FnOnce() -> bool,
    ) -> Result<(), StorageError> {
        let mut state = self.state();
        if !state.present || state.writes > 0 || !nothing_owed() {
            return Ok(());
        }
        match disk.remove_file(&self.path) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(error) => {
                return Err(disk_format(format!(
                    "remove {}: {error}",
                    self.path.display()
                )))
            }
        }
        sync_dir(disk, &self.root)?;
        state.present = false;
        Ok(())
    }
}
