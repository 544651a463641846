//! Bytes kept after a power loss. A store that finds it went down with answered writes not
//! synced (`boot.rs`) cannot tell which of its bytes are whole, so it takes a new incarnation
//! and the manager has it rebuilt from the others. It does not throw its bytes away:
//!
//! ```text
//! <root>/kept/<file id>/   a file's directory as it was at the power loss
//! ```
//!
//! When every server of a file lost power at once (one machine, one rack), there are no
//! others to rebuild from. Then its bytes synced before the power loss are still right (their
//! blocks are checksummed, and a torn block fails its checksum), and a rebuild puts the kept
//! bytes back on every server of the file and resyncs parity from the data (md's resync after
//! an unclean shutdown); without them, every synced file of a local cluster was lost
//! (session 24's `power_loss_all.rs`). Where the others can rebuild a file, it is rebuilt from
//! them and its kept bytes are dropped before its debt is cleared: kept bytes of a file never
//! outlive the debt they stand in for, so a later power loss never brings back older ones.
//!
//! A second power loss before the rebuild finished keeps the older bytes of a file that has
//! both: what the new incarnation holds of it is a partial rebuild. Keeping costs disk space:
//! until a rebuild drops them, a server holds its old bytes beside the rebuilt ones.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use tessera_wire::StorageError;

use crate::disk::Disk;
use crate::io::disk as disk_error;
use crate::meta::sync_dir;
use crate::seal::{Seal, Sealed};

pub(crate) const KEPT_DIR: &str = "kept";

/// Moves every file directory of `files_dir` under `<root>/kept`, but for files kept there
/// already (an earlier power loss's, not yet rebuilt), whose directory here is deleted.
/// Leaves `files_dir` empty. Safe to run again after a crash part-way.
pub(crate) fn keep_files(
    disk: &dyn Disk,
    root: &Path,
    files_dir: &Path,
) -> Result<(), StorageError> {
    let kept = root.join(KEPT_DIR);
    match disk.create_dir(&kept) {
        Ok(()) => sync_dir(disk, root)?,
        Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
        Err(error) => return Err(disk_error(format_args!("create {}", kept.display()), error)),
    }
    let names = match disk.read_dir(files_dir) {
        Ok(names) => names,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(disk_error(
                format_args!("list {}", files_dir.display()),
                error,
            ));
        }
    };
    for name in names {
        let (from, to) = (files_dir.join(&name), kept.join(&name));
        let held = disk
            .kind(&to)
            .map_err(|error| disk_error(format_args!("stat {}", to.display()), error))?;
        let result = match held {
            Some(_) => disk.remove_dir_all(&from),
            None => disk.rename(&from, &to),
        };
        result.map_err(|error| disk_error(format_args!("keep {}", from.display()), error))?;
    }
    // The new names first: a power loss between the two syncs leaves a directory under both
    // names at worst, never under neither.
    sync_dir(disk, &kept)?;
    sync_dir(disk, files_dir)
}

/// Where a file's kept bytes are, and the mark left when they were put back.
pub(crate) struct KeptFile {
    /// `<root>/kept/<file id>`: the file's directory as it was at the power loss.
    pub dir: PathBuf,
    /// `<root>/kept/<file id>.restored`: the bytes were put back, and the rebuild that did it
    /// has not finished (it drops the mark once the file's debts are cleared). A rebuild run
    /// again after dying part-way finds the file restored already.
    pub restored: PathBuf,
}

impl KeptFile {
    pub(crate) fn of(root: &Path, name: &str) -> KeptFile {
        let kept = root.join(KEPT_DIR);
        KeptFile {
            dir: kept.join(name),
            restored: kept.join(format!("{name}.restored")),
        }
    }

    /// Whether the kept bytes are there, and whether they were put back.
    pub(crate) fn state(&self, disk: &dyn Disk) -> Result<(bool, bool), StorageError> {
        let exists = |path: &Path| {
            disk.kind(path)
                .map(|kind| kind.is_some())
                .map_err(|error| disk_error(format_args!("stat {}", path.display()), error))
        };
        Ok((exists(&self.dir)?, exists(&self.restored)?))
    }
}

/// Cuts a restored file's overflow log (`<dir>/overflow.log`) at its first record past the
/// seal (the length a store sync last made durable) that a power loss tore, with everything
/// after it: none of it was ever durable. Replayed, a torn record would count as damage and
/// make every range after it unreadable, synced entries too; dropped, each of their bytes
/// reads as it was before those writes, which a write never synced allows. Intact records
/// past the seal stay (the store's open syncs the whole file system without sealing again,
/// so they may be durable). A log with no seal was never sealed: any record may be torn. One
/// with a damaged seal is left as it is (damage stays damage).
pub(crate) fn cut_unsealed_overflow(disk: &dyn Disk, dir: &Path) -> Result<(), StorageError> {
    let log = dir.join("overflow.log");
    let sealed = match Seal::of(&log).read(disk)? {
        Sealed::Length(sealed) => sealed,
        Sealed::Missing => 0,
        Sealed::Damaged => return Ok(()),
    };
    let fail = |what: &str, error| disk_error(format_args!("{what} {}", log.display()), error);
    let file = match disk.open_existing(&log) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(fail("open", error)),
    };
    if let Some(cut) = crate::overflow::first_torn_past(&*file, sealed)? {
        file.set_len(cut).map_err(|error| fail("cut", error))?;
        file.sync_data().map_err(|error| fail("sync", error))?;
    }
    Ok(())
}
