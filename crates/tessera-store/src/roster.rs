//! Rosters of record directories: the names a directory of records holds, kept beside it, so
//! that a record deleted from under the store (a lost directory entry, a stray `rm`) is found.
//!
//! Intent records (`intent.rs`) and stale-parity records (`stale.rs`) are one file each, made
//! durable before their write is answered and deleted once resolved, so an empty directory
//! is the normal state and a deleted record looks exactly like a resolved one: the store
//! would trust parity that a dead writer left inconsistent. Each directory therefore has a
//! roster, `<dir>/roster`, rewritten in place with every record added or deleted: length u32
//! LE, crc32c u32 LE of the names, then the names, one per line, sorted. A name on the roster
//! with no file is a record lost; the caller treats it as damaged (its stripes' parity is not
//! trusted until it is recomputed from the data). A file not on the roster is taken as it is
//! (the roster is written after the record when one is added, before the file goes when one
//! is deleted, so a crash between the two leaves only that).
//!
//! The roster is not synced with each record (that would be one more `fdatasync` on every
//! read-modify-write): a process crash keeps the page cache, and [`crate::Store::sync`] makes
//! it durable. So a power loss can take the names added since the last sync; only a record
//! that is also deleted afterwards, a second fault, then goes unnoticed. A missing or damaged
//! roster tells nothing (a store from before rosters, or a torn rewrite) and is written again
//! from the directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tessera_wire::StorageError;

use crate::disk::{read_file, Disk, FileHandle};
use crate::io::disk;
use std::collections::HashMap;

/// Length and checksum before the names.
const HEADER_BYTES: usize = 8;
/// The roster's name in its directory (no record's name: those have a dot).
pub(crate) const ROSTER_NAME: &str = "roster";

/// The roster of one records directory.
pub(crate) struct Roster {
    path: PathBuf,
    names: BTreeSet<String>,
    /// What the roster on disk holds, if it is whole.
    on_disk: Option<BTreeSet<String>>,
    file: Option<FileHandle>,
    /// Written since it was last synced.
    dirty: bool,
}

impl Roster {
    /// The roster of `dir`, and the names it held (`None` if it is missing or damaged: it
    /// tells nothing).
    pub(crate) fn load(
        on: &dyn Disk,
        dir: &Path,
    ) -> Result<(Roster, Option<BTreeSet<String>>), StorageError> {
        let path = dir.join(ROSTER_NAME);
        let held = match read_file(on, &path) {
            Ok(bytes) => {
                let held = decode(&bytes);
                if held.is_none() {
                    tracing::warn!("{} is damaged: written again", path.display());
                }
                held
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(disk(format_args!("read {}", path.display()), error)),
        };
        let roster = Roster {
            path,
            names: BTreeSet::new(),
            on_disk: held.clone(),
            file: None,
            dirty: false,
        };
        Ok((roster, held))
    }

    /// Makes the roster hold exactly `names`, durably (at open; its directory is synced too
    /// if the roster is new).
    pub(crate) fn reset(
        &mut self,
        on: &dyn Disk,
        names: BTreeSet<String>,
    ) -> Result<(), StorageError> {
        let unchanged = self.on_disk.as_ref() == Some(&names);
        self.names = names;
        if unchanged {
            return Ok(());
        }
        let created = (on.kind(&self.path))
            .map_err(|e| disk(format_args!("stat {}", self.path.display()), e))?
            .is_none();
        self.write(on)?;
        self.sync()?;
        if created {
            crate::meta::sync_dir(on, self.path.parent().expect("in a directory"))?;
        }
        Ok(())
    }

    /// Adds a record's name (after its file is durable).
    pub(crate) fn add(&mut self, on: &dyn Disk, name: String) -> Result<(), StorageError> {
        if self.names.insert(name) {
            self.write(on)?;
        }
        Ok(())
    }

    /// Removes a record's name (before its file is deleted).
    pub(crate) fn remove(&mut self, on: &dyn Disk, name: &str) -> Result<(), StorageError> {
        if self.names.remove(name) {
            self.write(on)?;
        }
        Ok(())
    }

    /// Makes what was written durable.
    pub(crate) fn sync(&mut self) -> Result<(), StorageError> {
        if let (true, Some(file)) = (self.dirty, &self.file) {
            (file.sync_data())
                .map_err(|e| disk(format_args!("sync {}", self.path.display()), e))?;
            self.dirty = false;
        }
        Ok(())
    }

    fn write(&mut self, on: &dyn Disk) -> Result<(), StorageError> {
        let fail = |e| disk(format_args!("write {}", self.path.display()), e);
        let file = match &self.file {
            Some(file) => file.clone(),
            None => {
                let file = on.open(&self.path).map_err(fail)?;
                self.file = Some(file.clone());
                file
            }
        };
        let bytes = encode(&self.names);
        self.on_disk = None;
        file.write_all_at(&bytes, 0).map_err(fail)?;
        file.set_len(bytes.len() as u64).map_err(fail)?;
        self.on_disk = Some(self.names.clone());
        self.dirty = true;
        Ok(())
    }
}

/// The names a roster held that have no file among `present`: records lost.
pub(crate) fn lost<'a>(held: &'a BTreeSet<String>, present: &[String]) -> Vec<&'a str> {
    // (The roster never names itself.)
    let present: BTreeSet<&str> = present.iter().map(String::as_str).collect();
    (held.iter())
        .map(String::as_str)
        .filter(|name| !present.contains(name))
        .collect()
}

fn encode(names: &BTreeSet<String>) -> Vec<u8> {
    let body: String = names.iter().map(|name| format!("{name}\n")).collect();
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(body.as_bytes()).to_le_bytes());
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Option<BTreeSet<String>> {
    let word = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let len = usize::try_from(word(0)?).ok()?;
    let body = bytes.get(HEADER_BYTES..HEADER_BYTES.checked_add(len)?)?;
    if crc32c::crc32c(body) != word(4)? {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    Some(text.lines().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roster_round_trips_and_every_flipped_bit_is_damage() {
        let names: BTreeSet<String> = ["3.7", "3.9", "12.0"].map(str::to_owned).into();
        let bytes = encode(&names);
        assert_eq!(decode(&bytes), Some(names.clone()));
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(decode(&flipped), Some(names.clone()), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), None, "cut to {cut}");
        }
        assert_eq!(decode(&encode(&BTreeSet::new())), Some(BTreeSet::new()));
        let present = ["3.9".to_owned()];
        assert_eq!(lost(&names, &present), ["12.0", "3.7"]);
    }
}

/// Records of one directory written and not synced: the store's `unsynced` mark was held
/// when each was written, so a power loss before a sync renews the whole store, and the
/// next sync makes them durable before the mark may go ([`UnsyncedRecords::take`]). A
/// record deleted before then is dropped: its directory's sync is all it needs. Bounded
/// by the records alive at once.
#[derive(Default)]
pub(crate) struct UnsyncedRecords(HashMap<PathBuf, FileHandle>);

impl UnsyncedRecords {
    /// `path` was written through `handle` and not synced.
    pub(crate) fn insert(&mut self, path: PathBuf, handle: FileHandle) {
        self.0.insert(path, handle);
    }

    /// `path` was deleted.
    pub(crate) fn remove(&mut self, path: &Path) {
        self.0.remove(path);
    }

    /// Everything written since the last call, for a sync to make durable.
    pub(crate) fn take(&mut self) -> HashMap<PathBuf, FileHandle> {
        std::mem::take(&mut self.0)
    }

    /// Puts back what a failed sync took, so the next one tries again (one deleted
    /// meanwhile is synced all the same, harmlessly); a record written again since keeps
    /// its newer handle.
    pub(crate) fn owe_again(&mut self, records: HashMap<PathBuf, FileHandle>) {
        for (path, handle) in records {
            self.0.entry(path).or_insert(handle);
        }
    }

    /// Whether every record written is durable (or deleted).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
